"""A version's policy names installed hook/interceptor extensions: checked at save (API, admin, service), built per run.

The extensions come from a real installed distribution (``tests/support/extension_dist.py``): a package and its
``.dist-info`` with entry points, on ``sys.path``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from rest_framework.test import APIClient

from agents import model_clients, services
from agents.extensions import unavailable_extensions
from agents.models import AgentVersion, Run, Session
from runtime.scripted import ScriptedModel, say
from runtime.types import ModelRequest, ModelResponse
from tenants.scoping import actor_for_user
from tests.factories import World
from tests.support import extension_dist
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db

REDACT = {"kind": "fx.redact", "config": {"secret": "O202411280001"}}
TAG = {"name": "tagger", "kind": "fx.tag", "config": {"key": "channel", "value": "web"}}


@pytest.fixture
def fx_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = extension_dist.install(tmp_path, monkeypatch)
    yield root
    extension_dist.cleanup()


@pytest.fixture
def api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _versions(slug: str = "order-assistant") -> str:
    return f"/api/v1/agents/{slug}/versions"


def _post(api: APIClient, policy: dict[str, Any]) -> Any:
    return api.post(_versions(), {"model": "demo/planner", "tools": ["query_order"], "policy": policy}, format="json")


def test_an_unknown_kind_is_a_400_naming_the_path_and_the_available_kinds(fx_dist: Path, api: APIClient) -> None:
    response = _post(api, {"hooks": [{"name": "x", "kind": "acme.nope"}], "interceptors": {"tool": [{"kind": "acme_tools:Evil"}]}})

    assert response.status_code == 400, response.content
    errors = response.json()["policy"]
    assert "hooks[0].kind: unknown hook kind 'acme.nope'; expected one of ['fx.tag', 'set_state', 'stop_when']" in errors
    assert "interceptors.tool[0].kind: unknown tool interceptor kind 'acme_tools:Evil'; expected one of ['fx.suffix']" in errors


def test_config_not_matching_the_schema_is_a_400_naming_the_path(fx_dist: Path, api: APIClient) -> None:
    response = _post(api, {"interceptors": {"model": [{"kind": "fx.redact", "config": {"secret": ["x"], "colour": "red"}}]}})

    assert response.status_code == 400, response.content
    errors = response.json()["policy"]
    assert "interceptors.model[0].config.secret: Input should be a valid string" in errors
    assert "interceptors.model[0].config.colour: Extra inputs are not permitted, got 'red'" in errors


def test_a_broken_extension_is_refused_at_save_without_saying_why_to_the_tenant(fx_dist: Path, api: APIClient) -> None:
    response = _post(api, {"interceptors": {"model": [{"kind": "fx.boom"}]}})

    assert response.status_code == 400
    [error] = response.json()["policy"]
    assert error.startswith("interceptors.model[0].kind: not available on this platform: model interceptor kind 'fx.boom'")
    assert "RuntimeError" not in error


def test_a_valid_version_is_saved_and_its_run_uses_the_extensions(fx_dist: Path, world: World, api: APIClient,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # given a version naming a contributed hook, model interceptor and tool interceptor, saved through the API
    policy = {"hooks": [TAG], "interceptors": {"model": [REDACT], "tool": [{"kind": "fx.suffix"}]}}
    created = api.post(_versions(), {"model": "demo/planner", "tools": ["query_order"], "policy": policy, "make_current": True},
                       format="json")
    assert created.status_code == 201, created.content
    assert created.json()["policy"]["interceptors"] == policy["interceptors"]
    version = AgentVersion.objects.get(agent=world.agent, number=created.json()["number"])

    # when a run of it executes in a worker (the real engine), with a model that records what it is sent
    sent: list[ModelRequest] = []
    scripted = ScriptedModel([say("It ships tomorrow.")])

    class Recorder:
        def complete(self, request: ModelRequest) -> ModelResponse:
            sent.append(request)
            return scripted.complete(request)

    monkeypatch.setattr(model_clients, "model_client_for", lambda run: Recorder())
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    run = Run.objects.create(tenant=world.tenant, agent=world.agent, version=version, session=session,
                             input="where is order O202411280001?")
    services.execute_run(str(run.pk))

    # then the model interceptor changed the request, and the hook ran under its policy name
    run.refresh_from_db()
    assert run.terminal_reason == "final_answer", run.error
    assert sent and "O202411280001" not in json.dumps(sent[0].messages) and "[redacted]" in json.dumps(sent[0].messages)
    assert run.events.filter(type="hook.decision", payload__hook="tagger").exists()


def test_the_service_and_the_admin_refuse_the_same_way(fx_dist: Path, world: World) -> None:
    # the service (what the API and the admin call)
    with pytest.raises(ValidationError) as info:
        services.create_version(actor=actor_for_user(world.operator), agent=world.agent, model="demo/planner",
                                policy={"interceptors": {"model": [{"kind": "fx.redact", "config": {}}]}})
    assert info.value.message_dict["policy"] == ["interceptors.model[0].config.secret: Field required"]

    # the admin form
    client = Client()
    client.force_login(world.operator)
    form = {"tenant": world.tenant.pk, "agent": world.agent.pk, "number": 7, "model": "demo/planner", "system_prompt": "",
            "tools": json.dumps(["query_order"]), "note": "",
            "policy": json.dumps({"hooks": [{"name": "t", "kind": "fx.tagg"}]})}
    response = client.post("/admin/agents/agentversion/add/", form)
    assert response.status_code == 200, "the form is shown again with the error"
    page = response.content.decode()
    assert "hooks[0].kind: unknown hook kind &#x27;fx.tagg&#x27;" in page and "fx.tag&#x27;, &#x27;set_state" in page
    assert not AgentVersion.objects.filter(agent=world.agent, number=7).exists()
    ok = client.post("/admin/agents/agentversion/add/", {**form, "policy": json.dumps({"hooks": [TAG]})})
    assert ok.status_code == 302
    assert AgentVersion.objects.get(agent=world.agent, number=7).policy["hooks"] == [TAG]


def test_the_platform_allow_list_restricts_what_versions_may_name(fx_dist: Path, api: APIClient) -> None:
    with override_settings(AGENTOPS_ALLOWED_EXTENSIONS=["fx.tag"]):
        refused = _post(api, {"interceptors": {"model": [REDACT]}})
        allowed = _post(api, {"hooks": [TAG]})
        assert "agentops_fx_other" not in sys.modules, "a kind outside the allow-list is never imported"
    assert refused.status_code == 400
    assert refused.json()["policy"] == [
        "interceptors.model[0].kind: not available on this platform: model interceptor kind 'fx.redact'; expected one of []"
    ]
    assert allowed.status_code == 201, allowed.content
    # and back to the default ("*": every installed extension)
    assert _post(api, {"interceptors": {"model": [REDACT]}}).status_code == 201


def test_list_extensions_shows_kind_group_source_schema_and_availability(fx_dist: Path) -> None:
    out = StringIO()
    call_command("list_extensions", stdout=out)
    text = out.getvalue()
    assert "fx.redact  [agentops.model_interceptors]  from agentops-fx-ext 1.0  available" in text
    assert "config: secret: string (required), replacement: string" in text
    assert "set_state  [agentops.hooks]  from built-in  available" in text
    assert "fx.boom  [agentops.model_interceptors]  from agentops-fx-ext 1.0  UNAVAILABLE" in text
    assert "reason: could not be imported: RuntimeError: boom at import" in text

    out = StringIO()
    call_command("list_extensions", "--json", stdout=out)
    rows = {row["kind"]: row for row in json.loads(out.getvalue())}
    assert rows["fx.suffix"]["group"] == "agentops.tool_interceptors"
    assert rows["fx.suffix"]["schema"]["properties"]["max_chars"]["type"] == "integer"
    assert rows["fx.missing"]["available"] is False

    with pytest.raises(CommandError, match="unavailable"):
        call_command("list_extensions", "--strict", stdout=StringIO())


def test_a_broken_extension_is_a_start_up_warning_not_a_crash(fx_dist: Path) -> None:
    warnings = unavailable_extensions()
    assert {w.id for w in warnings} == {"agentops.W002"}
    assert any("'fx.boom'" in w.msg and "boom at import" in w.msg for w in warnings)
    call_command("check", stdout=StringIO(), stderr=StringIO())  # a warning does not stop start-up
