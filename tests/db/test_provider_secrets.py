"""Tenants never name environment variables; deployment secrets reach platform providers from PROVIDER_SECRET_* only.

The attack (issue 11, hole 1): an operator key created a provider with ``api_key: env:SECRET_KEY`` and a
header ``env:DATABASE_URL``, pointed it at its own host and pressed "test connection".
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from rest_framework.test import APIClient

from agents import model_clients
from agents.models import Provider
from agents.provider_services import check_connection
from agents.providers import SecretError, encrypt_secret, provider_config
from tenants.scoping import actor_for_user
from tests.factories import World, make_user, make_world
from tests.support.deployment import set_env
from tests.support.recording_sink import RecordingSink

WORKER_SECRET = "worker-secret-value-0123456789"
DATABASE_URL = "postgres://app:db-password-42@db.internal/app"
TENANT_REFUSAL = "tenant providers cannot reference environment variables; paste the key, it is stored encrypted"


@pytest.fixture
def world(db: Any, monkeypatch: pytest.MonkeyPatch) -> World:
    model_clients.clear_cache()
    monkeypatch.setenv("SECRET_KEY", WORKER_SECRET)
    monkeypatch.setenv("DATABASE_URL", DATABASE_URL)
    monkeypatch.setattr(django_settings, "PROVIDER_EGRESS_ALLOW", ["127.0.0.1"])  # the sink listens on loopback
    return make_world()


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as server:
        yield server


def _key_client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _user_client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _body(base_url: str = "https://api.example.invalid/v1", **extra: Any) -> dict[str, Any]:
    return {"name": "mine", "base_url": base_url, "api_key": "sk-plain-0123456789", **extra}


def _forced_row(world: World, base_url: str, *, api_key_env: str = "SECRET_KEY", name: str = "forced") -> Provider:
    """A row as an earlier version of the console let a tenant save it."""
    return Provider.objects.create(
        tenant=world.tenant, name=name, base_url=base_url, api_key_env=api_key_env,
        default_headers_encrypted=encrypt_secret(json.dumps({"X-Db": "env:DATABASE_URL"})), default_header_names=["X-Db"],
    )


# -- saving -------------------------------------------------------------------------------------


@pytest.mark.parametrize("reference", ["env:SECRET_KEY", " ENV:SECRET_KEY", "secret:SHOP"])
def test_an_operator_key_cannot_point_the_api_key_at_the_environment(world: World, reference: str) -> None:
    # when an operator key creates a provider whose key names an environment variable
    response = _key_client(world.raw_key).post("/api/v1/providers", _body(api_key=reference), format="json")
    # then it is a 400 naming the field, and nothing is stored
    assert response.status_code == 400, response.content
    assert response.json()["api_key"] == [f"api_key: {TENANT_REFUSAL}"]
    assert not Provider.objects.exists()


def test_an_operator_key_cannot_put_an_environment_variable_in_a_header(world: World) -> None:
    response = _key_client(world.raw_key).post(
        "/api/v1/providers", _body(default_headers={"X-Db": "env:DATABASE_URL"}), format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["default_headers"] == [f"default_headers.X-Db: {TENANT_REFUSAL}"]
    assert not Provider.objects.exists()


def test_an_update_cannot_switch_an_existing_provider_to_the_environment(world: World) -> None:
    client = _key_client(world.raw_key)
    created = client.post("/api/v1/providers", _body(), format="json").json()
    response = client.patch(f"/api/v1/providers/{created['id']}", {"api_key": "env:SECRET_KEY"}, format="json")
    assert response.status_code == 400 and response.json()["api_key"] == [f"api_key: {TENANT_REFUSAL}"]
    assert Provider.objects.get(pk=created["id"]).api_key_env == ""


def test_the_admin_refuses_an_environment_reference_from_a_tenant_operator(world: World) -> None:
    client = APIClient()
    client.force_login(world.operator)
    form = {
        "tenant": world.tenant.pk, "name": "acme", "kind": "openai_compatible", "base_url": "https://api.example.invalid/v1",
        "api_key": "env:SECRET_KEY", "default_headers": json.dumps({"X-Db": "env:DATABASE_URL"}), "offered_models": "{}",
        "timeout": "30", "max_retries": "1", "requests_per_minute": "", "tokens_per_minute": "", "enabled": "on",
    }
    response = client.post("/admin/agents/provider/add/", form)
    page = response.content.decode()
    assert response.status_code == 200 and f"api_key: {TENANT_REFUSAL}" in page and f"default_headers.X-Db: {TENANT_REFUSAL}" in page
    assert not Provider.objects.exists()


def test_a_granted_deployment_secret_may_be_used_by_the_tenant(world: World, monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    # given a platform administrator granted the secret SHOP to this tenant
    world.tenant.settings = {"provider_secrets": ["SHOP"]}
    world.tenant.save()
    set_env(settings, "PROVIDER_SECRET_SHOP", "sk-shop-from-the-deployment")
    response = _key_client(world.raw_key).post("/api/v1/providers", _body(api_key="secret:SHOP"), format="json")
    assert response.status_code == 201, response.content
    assert response.json()["api_key_status"] == "set (from secret:SHOP)"
    row = Provider.objects.get(pk=response.json()["id"])
    assert provider_config(row).api_key == "sk-shop-from-the-deployment"
    # when the grant is withdrawn, the stored reference no longer resolves
    world.tenant.settings = {}
    world.tenant.save()
    with pytest.raises(SecretError, match="is not configured"):
        provider_config(Provider.objects.get(pk=row.pk))


# -- resolving ----------------------------------------------------------------------------------


def test_a_forced_environment_reference_never_leaves_the_worker(world: World, sink: RecordingSink) -> None:
    # given a tenant row holding env references, pointed at the tenant's own host
    row = _forced_row(world, f"http://127.0.0.1:{sink.port}/v1")
    # when its operator presses "test connection" (API and service)
    result = _key_client(world.raw_key).post(f"/api/v1/providers/{row.pk}/test").json()
    check = check_connection(actor=actor_for_user(world.operator), provider=row)
    # then nothing reaches the host, and the message is the generic one
    assert result["ok"] is False and check.ok is False
    assert result["message"] == "the API key of provider 'forced' is not configured: paste the key again (it is stored encrypted)"
    assert sink.requests == []
    assert WORKER_SECRET not in sink.seen() + json.dumps(result) and "db-password-42" not in sink.seen() + json.dumps(result)
    assert "SECRET_KEY" not in json.dumps(result) and "DATABASE_URL" not in json.dumps(result)


def test_a_forced_header_reference_is_refused_too(world: World, sink: RecordingSink) -> None:
    row = _forced_row(world, f"http://127.0.0.1:{sink.port}/v1", api_key_env="")
    row.api_key_encrypted = encrypt_secret("sk-plain-0123456789")
    row.save()
    result = _key_client(world.raw_key).post(f"/api/v1/providers/{row.pk}/test").json()
    assert result["ok"] is False and "header X-Db of provider 'forced' is not configured" in result["message"]
    assert sink.requests == [] and "db-password-42" not in json.dumps(result)


def test_the_message_is_the_same_whether_the_variable_exists_or_not(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_VARIABLE_HERE", raising=False)
    present = _forced_row(world, "https://api.example.invalid/v1", api_key_env="SECRET_KEY", name="same")
    first = _key_client(world.raw_key).post(f"/api/v1/providers/{present.pk}/test").json()["message"]
    present.delete()
    missing = _forced_row(world, "https://api.example.invalid/v1", api_key_env="NO_SUCH_VARIABLE_HERE", name="same")
    second = _key_client(world.raw_key).post(f"/api/v1/providers/{missing.pk}/test").json()["message"]
    assert first == second
    # and a run using such a provider gets the same generic reason
    with pytest.raises(SecretError) as caught:
        provider_config(missing)
    assert str(caught.value) == "the API key of provider 'same' is not configured: paste the key again (it is stored encrypted)"


def test_a_platform_provider_reads_a_secret_from_the_declared_prefix_only(
    world: World, monkeypatch: pytest.MonkeyPatch, settings: Any,
) -> None:
    root = make_user(is_superuser=True, is_staff=True)
    client = _user_client(root)
    # env:NAME is refused even for a superuser; secret:NAME is the way
    refused = client.post("/api/v1/providers", _body(shared=True, api_key="env:OPENAI_API_KEY"), format="json")
    assert refused.status_code == 400 and "write secret:NAME" in refused.json()["api_key"][0]
    created = client.post(
        "/api/v1/providers", _body(shared=True, api_key="secret:ACME", default_headers={"X-Org": "secret:ORG"}), format="json"
    )
    assert created.status_code == 201, created.content
    row = Provider.objects.get(pk=created.json()["id"])
    set_env(settings, "PROVIDER_SECRET_ACME", "sk-acme-from-prefix")
    set_env(settings, "PROVIDER_SECRET_ORG", "org-from-prefix")
    monkeypatch.setenv("ACME", "sk-bare-name-must-not-be-read")
    config = provider_config(row)
    assert config.api_key == "sk-acme-from-prefix" and config.default_headers == {"X-Org": "org-from-prefix"}
    # the bare variable is never a fallback
    set_env(settings, "PROVIDER_SECRET_ACME", None)
    with pytest.raises(SecretError) as caught:
        provider_config(row)
    assert str(caught.value) == "the API key of provider 'mine' is not configured: paste the key again (it is stored encrypted)"


def test_the_default_openai_provider_still_comes_from_the_environment(world: World, monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    set_env(settings, "OPENAI_BASE_URL", "https://api.example.invalid/v1")
    set_env(settings, "OPENAI_API_KEY", "sk-deployment-default")
    from agents.providers import env_default_provider

    default = env_default_provider()
    assert default is not None and default.api_key == "sk-deployment-default"


# -- what a failing or rebound target can make the worker say --------------------------------------


def test_a_tenant_providers_error_body_is_never_echoed(world: World) -> None:
    client = _key_client(world.raw_key)
    for status in (500, 400, 429):
        with RecordingSink(status=status, body='{"error": {"message": "SECRET-BODY from an internal service"}}') as failing:
            created = client.post("/api/v1/providers", _body(f"http://127.0.0.1:{failing.port}/v1", name=f"p{status}"), format="json")
            result = client.post(f"/api/v1/providers/{created.json()['id']}/test").json()
            assert failing.requests, "the allow-listed sink was contacted"
        assert result["ok"] is False and "SECRET-BODY" not in json.dumps(result), result
        assert f"HTTP {status}" in result["message"]


def test_a_provider_host_rebound_to_loopback_is_refused_at_connect_time(
    world: World, sink: RecordingSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a tenant provider on a name that resolves to loopback (not allow-listed)
    monkeypatch.setattr(django_settings, "PROVIDER_EGRESS_ALLOW", [])
    real = socket.getaddrinfo

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == "rebind.example.com" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    client = _key_client(world.raw_key)
    created = client.post("/api/v1/providers", _body(f"http://rebind.example.com:{sink.port}/v1"), format="json").json()
    result = client.post(f"/api/v1/providers/{created['id']}/test").json()
    assert result["ok"] is False and "loopback" in result["message"], result
    assert sink.requests == []
