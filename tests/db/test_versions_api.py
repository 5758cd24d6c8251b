"""Operators manage agents and versions through the API and the admin; a used version is history."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from agents.models import Agent, AgentVersion, Run, Session
from audit.models import ConfigChange
from tests.factories import World, make_user, make_world
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db

MESSAGES_HOOK = {"hooks": [{"name": "x", "kind": "set_state", "position": "before_model", "values": {"messages": []}}]}


@pytest.fixture
def api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _versions(slug: str = "order-assistant") -> str:
    return f"/api/v1/agents/{slug}/versions"


def _use(version: AgentVersion) -> None:
    session = Session.objects.create(tenant_id=version.tenant_id, agent=version.agent)
    Run.objects.create(tenant_id=version.tenant_id, agent=version.agent, version=version, session=session, input="hi")


def test_an_operator_creates_an_agent_and_a_version_with_a_normalised_policy(world: World, api: APIClient) -> None:
    # given an operator's key; when it creates an agent and a first version
    created = api.post("/api/v1/agents", {"slug": "refunds", "name": "Refunds"}, format="json")
    assert created.status_code == 201, created.content
    body = {"model": "demo/planner", "system_prompt": "Be brief.", "tools": ["query_order"],
            "policy": {"limits": {"model_calls": {"run_limit": 4}}}, "make_current": True}
    response = api.post(_versions("refunds"), body, format="json")
    # then the version is number 1, current, and its policy is the complete normalised document
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["number"], data["current"], data["locked"]) == (1, True, False)
    assert data["policy"]["limits"]["model_calls"]["run_limit"] == 4
    assert data["policy"]["limits"]["max_recursion"] == 10, "defaults are filled in"
    assert data["policy"]["loop_detection"]["enabled"] is True
    agent = Agent.objects.get(tenant=world.tenant, slug="refunds")
    assert agent.current_version.number == 1
    assert ConfigChange.objects.filter(tenant=world.tenant, action="agent_version.created").exists()
    # and the next version is number 2, readable and listed newest first
    assert api.post(_versions("refunds"), {"model": "demo/planner"}, format="json").json()["number"] == 2
    assert [v["number"] for v in api.get(_versions("refunds")).json()] == [2, 1]
    assert api.get(f"{_versions('refunds')}/1").json()["system_prompt"] == "Be brief."


def test_a_duplicate_agent_slug_is_refused_by_name(world: World, api: APIClient) -> None:
    response = api.post("/api/v1/agents", {"slug": "order-assistant", "name": "Again"}, format="json")
    assert response.status_code == 400
    assert "order-assistant" in response.json()["slug"][0]


def test_policy_errors_name_the_field_path(api: APIClient) -> None:
    body = {"model": "demo/planner", "policy": {"limits": {"model_calls": {"run_limit": -1}}, "budgets": {"run": {"tokns": 5}}}}
    response = api.post(_versions(), body, format="json")
    assert response.status_code == 400
    errors = response.json()["policy"]
    assert "limits.model_calls.run_limit: must be a positive integer or null, got -1" in errors
    assert any(e.startswith("budgets.run.tokns") for e in errors), errors


def test_a_hook_writing_messages_is_refused_at_save(api: APIClient) -> None:
    response = api.post(_versions(), {"model": "demo/planner", "policy": MESSAGES_HOOK}, format="json")
    assert response.status_code == 400
    [error] = response.json()["policy"]
    assert error.startswith("hooks[0].values.messages: 'messages' is written only by the agent loop")
    assert AgentVersion.objects.filter(agent__slug="order-assistant").count() == 1


def test_tools_must_exist_in_the_tenant_and_the_model_must_be_provider_slash_model(world: World, api: APIClient) -> None:
    other = make_world()  # another tenant's tools do not count
    assert other.version.tools
    response = api.post(_versions(), {"model": "gpt-4o", "tools": ["query_order", "launch_rockets"]}, format="json")
    assert response.status_code == 400
    data = response.json()
    assert "provider/model" in data["model"][0]
    assert data["tools"] == [data["tools"][0]] and "'launch_rockets'" in data["tools"][0]
    assert "query_order" in data["tools"][0], "the error lists the tools that do exist"
    assert api.post(_versions(), {"model": "demo/planner", "tools": "query_order"}, format="json").json()["tools"]


def test_a_version_a_run_used_is_read_only(world: World, api: APIClient) -> None:
    # given version 1 used by a run, and an unused version 2
    _use(world.version)
    fresh = api.post(_versions(), {"model": "demo/planner", "note": "draft"}, format="json").json()
    # when someone changes or deletes version 1, then 409 with what to do instead
    for method in ("patch", "put", "delete"):
        response = getattr(api, method)(f"{_versions()}/1", {"model": "demo/other", "note": "changed"}, format="json")
        assert response.status_code == 409, (method, response.content)
        assert "create a new version" in response.json()["detail"]
    version = AgentVersion.objects.get(pk=world.version.pk)
    assert (version.model, version.note) == ("demo/planner", "")
    assert api.get(f"{_versions()}/1").json()["locked"] is True
    # while the unused version 2 can still change (validated again) and be deleted
    changed = api.patch(f"{_versions()}/{fresh['number']}", {"note": "ready"}, format="json")
    assert changed.status_code == 200 and changed.json()["note"] == "ready"
    refused = api.patch(f"{_versions()}/{fresh['number']}", {"policy": MESSAGES_HOOK}, format="json")
    assert refused.status_code == 400 and "messages" in refused.json()["policy"][0]
    assert api.delete(f"{_versions()}/{fresh['number']}").status_code == 204


def test_viewers_read_but_cannot_create_and_other_tenants_see_nothing(world: World) -> None:
    viewer = APIClient()
    viewer.force_authenticate(world.viewer)
    assert viewer.get(_versions()).status_code == 200
    assert viewer.post(_versions(), {"model": "demo/planner"}, format="json").status_code == 403
    assert viewer.post("/api/v1/agents", {"slug": "x", "name": "X"}, format="json").status_code == 403
    outsider = make_world()
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION=f"Bearer {outsider.raw_key}")
    # the outsider's own agent has the same slug; the first tenant's versions stay invisible
    assert [v["number"] for v in stranger.get(_versions()).json()] == [1]
    assert stranger.post(_versions(), {"model": "demo/planner"}, format="json").json()["number"] == 2
    assert AgentVersion.objects.filter(agent=world.agent).count() == 1
    lonely = make_user()
    nobody = APIClient()
    nobody.force_authenticate(lonely)
    assert nobody.get(_versions()).status_code == 404


def _admin_client(world: World) -> Client:
    client = Client()
    client.force_login(world.operator)
    return client


def _admin_form(world: World, **overrides: Any) -> dict[str, Any]:
    import json

    data = {
        "tenant": world.tenant.pk, "agent": world.agent.pk, "number": 7, "model": "demo/planner", "system_prompt": "",
        "tools": json.dumps(["query_order"]), "policy": json.dumps({}), "note": "",
    }
    data.update(overrides)
    return data


def test_the_admin_refuses_a_hook_writing_messages_and_stores_a_normalised_policy(world: World) -> None:
    import json

    client = _admin_client(world)
    response = client.post("/admin/agents/agentversion/add/", _admin_form(world, policy=json.dumps(MESSAGES_HOOK)))
    assert response.status_code == 200, "the form is shown again with the error"
    assert "hooks[0].values.messages" in response.content.decode()
    assert not AgentVersion.objects.filter(agent=world.agent, number=7).exists()
    bad_tool = client.post("/admin/agents/agentversion/add/", _admin_form(world, tools=json.dumps(["nope"])))
    assert "No tool named" in bad_tool.content.decode()
    ok = client.post("/admin/agents/agentversion/add/", _admin_form(world, policy=json.dumps({"limits": {"max_recursion": 4}})))
    assert ok.status_code == 302, ok.content.decode()[:2000]
    saved = AgentVersion.objects.get(agent=world.agent, number=7)
    assert saved.policy["limits"]["max_recursion"] == 4 and "budgets" in saved.policy
