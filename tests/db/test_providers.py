"""Model providers: the API and admin (write-only secrets, validation, tenant scoping, audit), the gateway a run gets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from rest_framework.test import APIClient

from agents import model_clients
from agents.models import Agent, AgentVersion, Provider, Run, Session
from agents.providers import ModelEntry, check_fields, check_headers, check_models, decrypt_secret, model_table
from audit.models import ConfigChange
from llm import ModelInfo, ProviderAuthError
from llm.errors import MalformedResponseError
from runtime.config import check_policy
from runtime.documents import DocumentError
from runtime.types import ModelRequest, TerminalReason
from tests.factories import World, make_user, make_world
from tests.support.deployment import set_env
from tests.support.fake_openai import FakeOpenAI, server_error, text
from tests.unit.runtime.helpers import harness

SECRET_KEY_VALUE = "sk-test-provider-key-0123456789abcdef"
PRICES = {"gpt-4o-mini": {"context_window": 128000, "price_in_per_1m": 0.15, "price_out_per_1m": 0.6}}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(api_key=SECRET_KEY_VALUE, models=["gpt-4o-mini"]) as server:
        yield server


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    """The fake servers listen on 127.0.0.1, which the egress guard refuses for tenants' providers unless allowed."""
    settings.PROVIDER_EGRESS_ALLOW = ["127.0.0.1"]


@pytest.fixture
def worlds(db: Any) -> tuple[World, World]:
    model_clients.clear_cache()
    return make_world(), make_world()


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _create(client: APIClient, **body: Any) -> Any:
    payload = {"name": "openai", "base_url": "https://api.example.invalid/v1", "api_key": SECRET_KEY_VALUE, "models": PRICES, **body}
    return client.post("/api/v1/providers", payload, format="json")


def _run(world: World, model: str, policy: dict[str, Any] | None = None) -> Run:
    agent = Agent.objects.create(tenant=world.tenant, slug=f"llm-{Agent.objects.count()}", name="llm")
    version = AgentVersion.objects.create(tenant=world.tenant, agent=agent, number=1, model=model, policy=policy or {})
    session = Session.objects.create(tenant=world.tenant, agent=agent)
    run = Run.objects.create(tenant=world.tenant, agent=agent, version=version, session=session, input="hi")
    return Run.objects.select_related("tenant", "version").get(pk=run.pk)


def _request(model: str) -> ModelRequest:
    return ModelRequest(model=model, messages=[{"role": "user", "content": "hello"}], tools=[])


# -- API ----------------------------------------------------------------------------------------


def test_the_api_key_is_write_only_and_stored_encrypted(worlds: Any) -> None:
    world, _ = worlds
    response = _create(_client(world.operator), default_headers={"OpenAI-Organization": "org-secret-value"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert "api_key" not in body and body["api_key_status"] == "set (encrypted)"
    assert body["default_headers_masked"] == {"OpenAI-Organization": "***"}
    assert body["tenant"] == world.tenant.slug and body["models"] == PRICES
    assert SECRET_KEY_VALUE not in response.content.decode() and "org-secret-value" not in response.content.decode()
    row = Provider.objects.get(pk=body["id"])
    assert SECRET_KEY_VALUE not in row.api_key_encrypted and "org-secret-value" not in row.default_headers_encrypted
    assert decrypt_secret(row.api_key_encrypted, "key") == SECRET_KEY_VALUE
    listed = _client(world.operator).get("/api/v1/providers").content.decode()
    assert SECRET_KEY_VALUE not in listed and "org-secret-value" not in listed


def test_a_key_can_reference_a_granted_deployment_secret_and_be_replaced_or_cleared(worlds: Any) -> None:
    world, _ = worlds
    world.tenant.settings = {"provider_secrets": ["OPENAI"]}
    world.tenant.save()
    client = _client(world.operator)
    created = _create(client, api_key="secret:OPENAI").json()
    assert created["api_key_status"] == "set (from secret:OPENAI)"
    url = f"/api/v1/providers/{created['id']}"
    assert client.patch(url, {"timeout": 12}, format="json").json()["api_key_status"] == "set (from secret:OPENAI)"
    assert client.patch(url, {"api_key": "sk-other-0123456789"}, format="json").json()["api_key_status"] == "set (encrypted)"
    assert client.patch(url, {"api_key": ""}, format="json").json()["api_key_status"] == "not set"


def test_validation_errors_name_the_field(worlds: Any) -> None:
    world, _ = worlds
    bad_models = {"gpt-4o-mini": {"context_window": 0, "price_in_per_1m": "cheap", "colour": "red"}}
    response = _create(_client(world.operator), name="open/ai", base_url="ftp://x", models=bad_models, timeout=0,
                       api_key="sk with spaces", requests_per_minute=0)
    assert response.status_code == 400
    errors = response.json()
    flat = json.dumps(errors)
    assert "models.gpt-4o-mini.price_in_per_1m: must be a number >= 0" in flat
    assert "models.gpt-4o-mini.context_window: must be a positive integer" in flat
    assert "models.gpt-4o-mini.colour: unknown field" in flat
    assert "base_url: must be an http(s) URL" in flat and "name: use letters" in flat
    assert "timeout" in flat and "api_key: must contain no spaces" in flat
    reserved = _create(_client(world.operator), name="demo")
    assert reserved.status_code == 400 and "built-in deterministic provider" in json.dumps(reserved.json())
    assert not Provider.objects.exists()


def test_the_models_table_is_a_typed_document_with_every_problem_and_its_defaults() -> None:
    found = check_models({"a b": {}, "m": {"context_window": 0, "price_in_per_1m": "cheap", "colour": "red"}, "n": 3})
    assert found[0] == "models.a b: a model name must be non-empty and contain no spaces, got 'a b'"
    assert found[1:4] == [
        "models.m.context_window: must be a positive integer, got 0",
        "models.m.price_in_per_1m: must be a number >= 0, got 'cheap'",
        "models.m.colour: unknown field; expected one of ['context_window', 'price_in_per_1m', 'price_out_per_1m']",
    ]
    assert found[4].startswith("models.n: must be an object with context_window, price_in_per_1m, price_out_per_1m, e.g.")
    assert check_models([1])[0].startswith("models: must be an object of model name -> settings, e.g.")
    # Defaults live on the document; the gateway's table is read from it.
    assert model_table({"m": {"price_in_per_1m": 1}}) == {"m": ModelInfo(128_000, 1.0, 0.0)}
    with pytest.raises(DocumentError, match=r"models\.m\.price_out_per_1m: must be a number >= 0, got -1"):
        model_table({"m": {"price_out_per_1m": -1}})
    entry = ModelEntry.model_json_schema()
    assert entry["additionalProperties"] is False and entry["properties"]["price_in_per_1m"]["minimum"] == 0
    assert entry["properties"]["context_window"]["default"] == 128_000


def test_default_headers_are_checked_as_a_document_with_the_providers_scope() -> None:
    found = check_headers({"Authorization": "x", "bad name": "y", "X-A": "a\nb"})
    assert found == [
        "default_headers.Authorization: set the API key field instead of an Authorization header",
        "default_headers.bad name: is not a valid header name (letters, digits and !#$%&'*+.^_`|~-)",
        "default_headers.X-A: must be a non-empty string on one line",
    ]
    assert check_headers({"X-S": "secret:OK", "X-T": "secret:NO"}, granted={"OK"}) == [
        "default_headers.X-T: tenant providers cannot reference environment variables; paste the key, it is stored encrypted"
    ]
    assert check_headers({"X-S": "secret:NO"}, platform=True) == []
    assert check_headers(3) == ['default_headers: must be an object of header name -> value, e.g. {"OpenAI-Organization": "org-123"}']


def test_a_providers_settings_are_one_typed_document_and_every_problem_is_keyed_by_field() -> None:
    found = check_fields({"name": "open/ai", "kind": "x", "base_url": "ftp://x", "timeout": 0, "max_retries": 9,
                          "offered_models": {"m": {"context_window": 0}}, "requests_per_minute": 0, "tokens_per_minute": None})
    assert found == {
        "name": ["name: use letters, digits, '.', '_' or '-' (no '/'), got 'open/ai'"],
        "kind": ["kind: must be one of ['openai_compatible', 'deterministic'], got 'x'"],
        "base_url": ["base_url: must be an http(s) URL such as https://api.openai.com/v1, got 'ftp://x'"],
        "timeout": ["timeout: must be a number above 0 and at most 600, got 0"],
        "max_retries": ["max_retries: must be an integer from 0 to 5, got 9"],
        "models": ["models.m.context_window: must be a positive integer, got 0"],
        "requests_per_minute": ["requests_per_minute: must be a positive integer, or empty for unlimited, got 0"],
    }
    assert check_fields({"name": "demo", "base_url": None}) == {
        "name": ["name: 'demo' is the built-in deterministic provider; choose another name"],
        "base_url": ["base_url: an OpenAI-compatible provider needs one, e.g. https://api.openai.com/v1"],
    }
    assert check_fields({"kind": "deterministic", "base_url": ""}) == {} and check_fields({}) == {}


def test_the_openapi_schema_shows_the_models_document(worlds: Any) -> None:
    world, _ = worlds
    schema = _client(world.operator).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    models = schema["components"]["schemas"]["Provider"]["properties"]["models"]
    assert models["additionalProperties"]["properties"]["context_window"]["default"] == 128_000


def test_a_duplicate_name_in_the_same_tenant_is_refused(worlds: Any) -> None:
    world, other = worlds
    assert _create(_client(world.operator)).status_code == 201
    again = _create(_client(world.operator))
    assert again.status_code == 400 and "already have a provider named 'openai'" in json.dumps(again.json())
    assert _create(_client(other.operator)).status_code == 201  # another tenant may use the name


def test_a_foreign_tenants_provider_is_a_404_everywhere(worlds: Any) -> None:
    world, outsider = worlds
    created = _create(_client(world.operator)).json()
    url = f"/api/v1/providers/{created['id']}"
    client = _client(outsider.operator)
    assert client.get(url).status_code == 404
    assert client.patch(url, {"timeout": 5}, format="json").status_code == 404
    assert client.post(f"{url}/test").status_code == 404
    assert client.delete(url).status_code == 404
    assert client.get("/api/v1/providers").json() == []


def test_a_viewer_reads_but_cannot_change_providers(worlds: Any) -> None:
    world, _ = worlds
    created = _create(_client(world.operator)).json()
    viewer = _client(world.viewer)
    assert viewer.get(f"/api/v1/providers/{created['id']}").status_code == 200
    assert viewer.patch(f"/api/v1/providers/{created['id']}", {"timeout": 5}, format="json").status_code == 403
    assert _create(viewer, name="other").status_code == 403


def test_shared_providers_are_managed_by_superusers_only(worlds: Any) -> None:
    world, _ = worlds
    assert _create(_client(world.operator), shared=True).status_code == 403
    root = make_user(is_superuser=True, is_staff=True)
    shared = _create(_client(root), shared=True)
    assert shared.status_code == 201 and shared.json()["tenant"] is None
    assert _client(world.operator).get(f"/api/v1/providers/{shared.json()['id']}").status_code == 404
    change = ConfigChange.objects.get(action="provider.created", target_id=str(shared.json()["id"]))
    assert change.tenant is None and change.actor == root


def test_every_change_is_audited_with_the_acting_user_and_no_secret(worlds: Any) -> None:
    world, _ = worlds
    client = _client(world.operator)
    created = _create(client, default_headers={"X-Team": "team-secret-token"}).json()
    client.patch(f"/api/v1/providers/{created['id']}", {"timeout": 9, "api_key": "sk-replaced-0123456789abc"}, format="json")
    client.delete(f"/api/v1/providers/{created['id']}")
    rows = list(ConfigChange.objects.filter(target_type="Provider").order_by("id"))
    assert [r.action for r in rows] == ["provider.created", "provider.changed", "provider.deleted"]
    assert all(r.actor == world.operator and r.tenant == world.tenant for r in rows)
    assert rows[1].details["changes"] == {"timeout": [30.0, 9]} and rows[1].details["api_key"] == "replaced"
    dumped = json.dumps([r.details for r in rows])
    assert SECRET_KEY_VALUE not in dumped and "sk-replaced" not in dumped and "team-secret-token" not in dumped
    assert rows[0].details["default_headers"] == ["X-Team"]


def test_the_test_endpoint_lists_models_or_says_what_is_wrong(worlds: Any, fake: FakeOpenAI) -> None:
    world, _ = worlds
    client = _client(world.operator)
    good = _create(client, base_url=fake.base_url).json()
    result = client.post(f"/api/v1/providers/{good['id']}/test").json()
    assert result["ok"] is True and result["models"] == ["gpt-4o-mini"], result
    bad = _create(client, name="wrong-key", base_url=fake.base_url, api_key="sk-wrong-key-0123456789abcdef").json()
    result = client.post(f"/api/v1/providers/{bad['id']}/test").json()
    assert result["ok"] is False and "API key for provider 'wrong-key' was refused (HTTP 401)" in result["message"]
    assert "sk-wrong-key-0123456789abcdef" not in json.dumps(result)


def test_a_tenants_provider_may_not_reach_private_addresses(worlds: Any, fake: FakeOpenAI, monkeypatch: Any) -> None:
    world, _ = worlds
    monkeypatch.setattr(django_settings, "PROVIDER_EGRESS_ALLOW", [])
    client = _client(world.operator)
    created = _create(client, base_url=fake.base_url).json()
    result = client.post(f"/api/v1/providers/{created['id']}/test").json()
    assert result["ok"] is False and "EgressDenied" in result["message"], result
    with pytest.raises(Exception, match=r"EgressDenied: egress denied for http://127\.0\.0\.1"):
        model_clients.model_client_for(_run(world, "openai/gpt-4o-mini")).complete(_request("openai/gpt-4o-mini"))
    assert fake.requests == []


# -- admin --------------------------------------------------------------------------------------


def test_the_admin_shows_set_or_not_set_and_saves_through_the_service(worlds: Any, fake: FakeOpenAI) -> None:
    world, _ = worlds
    world.operator.is_staff = True
    world.operator.save()
    client = APIClient()
    client.force_login(world.operator)
    form = {
        "tenant": world.tenant.pk, "name": "acme", "kind": "openai_compatible", "base_url": fake.base_url,
        "api_key": SECRET_KEY_VALUE, "default_headers": "", "offered_models": json.dumps(PRICES), "timeout": "30",
        "max_retries": "1", "requests_per_minute": "", "tokens_per_minute": "", "enabled": "on",
    }
    response = client.post("/admin/agents/provider/add/", form)
    assert response.status_code == 302, response.content.decode()[:3000]
    provider = Provider.objects.get(name="acme")
    assert decrypt_secret(provider.api_key_encrypted, "key") == SECRET_KEY_VALUE
    assert ConfigChange.objects.filter(action="provider.created", actor=world.operator, target_id=str(provider.pk)).exists()
    page = client.get(f"/admin/agents/provider/{provider.pk}/change/").content.decode()
    assert "set (encrypted)" in page and SECRET_KEY_VALUE not in page and provider.api_key_encrypted not in page
    # an edit that leaves the key field empty keeps the key
    response = client.post(f"/admin/agents/provider/{provider.pk}/change/", {**form, "api_key": "", "timeout": "20"})
    assert response.status_code == 302
    provider.refresh_from_db()
    assert provider.timeout == 20 and decrypt_secret(provider.api_key_encrypted, "key") == SECRET_KEY_VALUE
    # a bad models table is refused with the field named
    response = client.post("/admin/agents/provider/add/", {**form, "name": "acme2", "offered_models": '{"m": {"price_in_per_1m": -1}}'})
    assert response.status_code == 200 and "models.m.price_in_per_1m: must be a number &gt;= 0" in response.content.decode()
    # the Test connection action
    response = client.post("/admin/agents/provider/", {"action": "test_connection", "_selected_action": [provider.pk]}, follow=True)
    assert "acme" in response.content.decode() and "offers 1 model(s)" in response.content.decode()


def test_the_admin_hides_a_foreign_tenants_provider(worlds: Any) -> None:
    world, outsider = worlds
    created = _create(_client(world.operator), name="foreign-llm").json()
    client = APIClient()
    outsider.operator.is_staff = True
    outsider.operator.save()
    client.force_login(outsider.operator)
    response = client.get(f"/admin/agents/provider/{created['id']}/change/")
    assert response.status_code in (302, 404)  # the admin redirects to the index for an object it cannot find
    listing = client.get("/admin/agents/provider/")
    assert listing.status_code == 200 and "foreign-llm" not in listing.content.decode()


# -- the gateway a run gets ---------------------------------------------------------------------


def test_a_run_gets_its_tenants_providers_the_env_default_and_demo(worlds: Any, fake: FakeOpenAI, monkeypatch: Any, settings: Any) -> None:
    world, other = worlds
    set_env(settings, "OPENAI_BASE_URL", fake.base_url)
    set_env(settings, "OPENAI_API_KEY", SECRET_KEY_VALUE)
    _create(_client(world.operator), name="acme", base_url=fake.base_url)
    _create(_client(other.operator), name="other-only", base_url=fake.base_url)
    run = _run(world, "acme/gpt-4o-mini")
    gateway = model_clients.gateway_for(run)
    assert {"demo", "openai", "acme"} <= set(gateway.providers) and "other-only" not in gateway.providers
    info = model_clients.model_info_for(run)
    assert info is not None and info.price_in_per_1m == 0.15 and info.context_window == 128000
    fake.script(text("hello from acme", usage={"prompt_tokens": 1000, "completion_tokens": 500}))
    response = model_clients.model_client_for(run).complete(_request("acme/gpt-4o-mini"))
    assert response.content == "hello from acme" and response.model == "acme/gpt-4o-mini"
    assert response.usage.cost == pytest.approx(1000 * 0.15 / 1e6 + 500 * 0.6 / 1e6)
    fake.script(text("hello from env"))
    assert model_clients.model_client_for(run).complete(_request("openai/gpt-4o-mini")).content == "hello from env"


def test_gateways_are_cached_until_a_provider_changes(worlds: Any, fake: FakeOpenAI) -> None:
    world, _ = worlds
    created = _create(_client(world.operator), name="acme", base_url=fake.base_url).json()
    first = model_clients.gateway_for(_run(world, "acme/gpt-4o-mini"))
    assert model_clients.gateway_for(_run(world, "acme/gpt-4o-mini")) is first
    _client(world.operator).patch(f"/api/v1/providers/{created['id']}", {"timeout": 7}, format="json")
    changed = model_clients.gateway_for(_run(world, "acme/gpt-4o-mini"))
    assert changed is not first and changed.providers["acme"].timeout == 7


def test_unusable_providers_fail_with_a_reason_and_fall_back(worlds: Any, fake: FakeOpenAI, monkeypatch: Any, settings: Any) -> None:
    world, _ = worlds
    set_env(settings, "OPENAI_BASE_URL", None)
    created = _create(_client(world.operator), name="acme", base_url=fake.base_url).json()
    _client(world.operator).patch(f"/api/v1/providers/{created['id']}", {"enabled": False}, format="json")
    run = _run(world, "acme/gpt-4o-mini", {"model": {"fallbacks": ["demo/planner"]}})
    response = model_clients.model_client_for(run).complete(_request("acme/gpt-4o-mini"))
    assert response.model == "demo/planner"
    failed = [t for t in response.trace if t.get("type") == "model.attempt" and t["outcome"] != "ok"]
    assert "provider 'acme' is disabled" in failed[0]["error"]
    missing = _run(world, "openai/gpt-4o-mini")
    with pytest.raises(Exception) as caught:
        model_clients.model_client_for(missing).complete(_request("openai/gpt-4o-mini"))
    assert "no provider named 'openai' is configured for this tenant" in str(caught.value)
    assert "OPENAI_BASE_URL" in str(caught.value) and caught.value.trace  # type: ignore[attr-defined]


def test_a_tenant_rate_limit_comes_from_tenant_settings(worlds: Any) -> None:
    world, _ = worlds
    world.tenant.settings = {"rate_limit": {"requests_per_minute": 60}}
    world.tenant.save()
    gateway = model_clients.gateway_for(_run(world, "demo/planner"))
    assert gateway.config.tenant_rate_limit is not None and gateway.config.tenant_rate_limit.requests_per_minute == 60


def test_a_failover_on_500_reaches_the_second_provider(worlds: Any, fake: FakeOpenAI) -> None:
    world, _ = worlds
    with FakeOpenAI(api_key=SECRET_KEY_VALUE, default=server_error()) as broken:
        _create(_client(world.operator), name="primary", base_url=broken.base_url)
        _create(_client(world.operator), name="backup", base_url=fake.base_url)
        run = _run(world, "primary/gpt-4o-mini", {"model": {"fallbacks": ["backup/gpt-4o-mini"]}})
        response = model_clients.model_client_for(run).complete(_request("primary/gpt-4o-mini"))
        assert response.model == "backup/gpt-4o-mini"
        outcomes = [(t["provider"], t["outcome"]) for t in response.trace if t.get("type") == "model.attempt"]
        assert outcomes == [("primary", "server_error"), ("primary", "server_error"), ("backup", "ok")]


def test_seed_demo_adds_the_llm_agent_on_the_default_provider(db: Any, monkeypatch: Any, settings: Any) -> None:
    set_env(settings, "DEMO_PASSWORD", "demo-password-123")
    set_env(settings, "DEMO_API_KEY", "aok_0123abcd_s3cr3t-value")
    set_env(settings, "OPENAI_MODEL", "gpt-4.1-mini")
    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115
    agent = Agent.objects.get(slug="order-assistant-llm", tenant__slug="demo")
    assert agent.current_version.model == "openai/gpt-4.1-mini"
    plain = Agent.objects.get(slug="order-assistant", tenant__slug="demo")
    assert agent.current_version.tools == plain.current_version.tools


# -- policy and loop (no database) --------------------------------------------------------------


def test_the_policy_model_section_is_validated_with_field_paths() -> None:
    assert check_policy({"model": {"fallbacks": ["backup/gpt-4o-mini"], "task_models": {"summarize": "openai/gpt-4o-mini"}}}) == []
    errors = check_policy({"model": {"fallbacks": ["gpt-4o"], "task_models": {"plan": "a/b", "summarize": 3}, "x": 1}})
    assert any(e.startswith("model.fallbacks[0]: must be \"provider/model\"") for e in errors)
    assert any(e.startswith("model.task_models.plan: unknown task class") for e in errors)
    assert any(e.startswith("model.task_models.summarize: must be") for e in errors)
    assert any(e.startswith("model.x: unknown field") for e in errors)


def test_a_failed_model_call_emits_its_attempts_as_children_of_model_error() -> None:
    def refuse(request: ModelRequest) -> Any:
        error = ProviderAuthError("the API key for provider 'acme' was refused (HTTP 401); update the provider's key", provider="acme")
        error.trace = [{"type": "model.attempt", "provider": "acme", "attempt": 1, "outcome": "auth_error", "status_code": 401}]
        raise error

    h = harness([refuse])
    result = h.run()
    assert result.terminal_reason == TerminalReason.ERROR
    events = h.store.events(h.run_id)
    attempt = next(e for e in events if e["type"] == "model.attempt")
    failure = next(e for e in events if e["type"] == "model.error")
    assert attempt["parent_span_id"] == failure["span_id"] and attempt["payload"]["outcome"] == "auth_error"
    assert "was refused (HTTP 401)" in failure["payload"]["error"]


def test_a_tenants_provider_answer_past_the_bound_fails_the_call_not_the_worker(worlds: Any, fake: FakeOpenAI,
                                                                                  monkeypatch: Any) -> None:
    """A tenant's endpoint is hostile input: an endless (or compressed-bomb) answer would fill the worker's memory.
    Its answers are bounded (agents/providers.py MAX_RESPONSE_BYTES, 32 MiB; 10 kB here), decompressed."""
    from agents import providers

    monkeypatch.setattr(providers, "MAX_RESPONSE_BYTES", 10_000)
    world, _ = worlds
    _create(_client(world.operator), name="acme", base_url=fake.base_url)
    run = _run(world, "acme/gpt-4o-mini")
    fake.script(text("y" * 20_000), text("y" * 20_000), text("y" * 20_000))
    with pytest.raises(MalformedResponseError, match="sent an answer this console does not take") as caught:
        model_clients.model_client_for(run).complete(_request("acme/gpt-4o-mini"))
    assert "larger than 10000 bytes" in str(caught.value) and not caught.value.retryable
    assert len(fake.chat_requests) == 1  # not retried: the same endpoint would answer the same
    fake.reset()
    fake.script(text("small"))
    assert model_clients.model_client_for(run).complete(_request("acme/gpt-4o-mini")).content == "small"
