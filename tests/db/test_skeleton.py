"""Issue 2 in-process checks: settings, API keys, the API's error shapes, docs offline, seed_demo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from tenants.auth import find_api_key
from tenants.models import ApiKey, hash_key
from tests.factories import make_world
from tests.support.deployment import set_env

ROOT = Path(__file__).resolve().parents[2]


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG")}
    full.update(env)
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=full, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DEBUG": "maybe", "SECRET_KEY": "x" * 40}, "DEBUG"),
        ({"DEBUG": "false"}, "SECRET_KEY"),
        ({"DEBUG": "true", "DATABASE_URL": "mysql://nope"}, "DATABASE_URL"),
        ({"DEBUG": "true", "REDIS_URL": "http://127.0.0.1:6379"}, "REDIS_URL"),
        ({"DEBUG": "true", "RUN_LEASE_SECONDS": "soon"}, "RUN_LEASE_SECONDS"),
    ],
)
def test_a_bad_setting_stops_start_up_with_a_message_naming_the_variable(env: dict[str, str], named: str) -> None:
    result = _check(env)
    assert result.returncode != 0
    assert named in result.stderr


def test_good_settings_start() -> None:
    assert _check({"DEBUG": "false", "SECRET_KEY": "k" * 50}).returncode == 0


@pytest.mark.django_db
def test_api_keys_are_stored_hashed_with_a_visible_prefix_and_can_be_revoked() -> None:
    world = make_world()
    key = ApiKey.objects.get(pk=world.key.pk)
    assert world.raw_key not in (key.hashed, key.prefix)
    assert key.hashed == hash_key(world.raw_key)
    assert world.raw_key.startswith(key.prefix + "_")
    assert find_api_key(world.raw_key) == key
    assert ApiKey.objects.get(pk=key.pk).last_used_at is not None
    from accounts.services import revoke_api_key

    revoke_api_key(key=key, actor=None)
    assert find_api_key(world.raw_key) is None
    assert find_api_key(world.raw_key[:-1] + "x") is None


@pytest.mark.django_db
def test_agents_are_listed_for_the_keys_tenant_only() -> None:
    mine, other = make_world(), make_world()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {mine.raw_key}")
    body = client.get("/api/v1/agents").json()
    assert [a["slug"] for a in body["results"]] == ["order-assistant"]
    assert client.get("/api/v1/agents/order-assistant").json()["current_version"]["number"] == 1
    client.credentials(HTTP_AUTHORIZATION="Bearer aok_deadbeef_wrong")
    response = client.get("/api/v1/agents")
    assert response.status_code == 401 and "not valid" in response.json()["detail"]
    assert other.tenant.slug not in str(body)


@pytest.mark.django_db
def test_a_viewer_may_read_but_not_start_runs() -> None:
    world = make_world()
    client = APIClient()
    client.force_login(world.viewer)
    assert client.get("/api/v1/runs").status_code == 200
    response = client.post("/api/v1/runs", {"agent": "order-assistant", "input": "hi"}, format="json")
    assert response.status_code == 403


@pytest.mark.django_db
def test_openapi_schema_and_swagger_ui_work_offline(client: object) -> None:
    schema = client.get("/api/schema/")  # type: ignore[attr-defined]
    assert schema.status_code == 200 and b"/api/v1/runs" in schema.content
    docs = client.get("/api/docs/")  # type: ignore[attr-defined]
    assert docs.status_code == 200
    # the CSP nonces are random base64: one read "pxCdN5…" once, a "cdn" that is no address at all
    html = re.sub(r'nonce="[^"]*"', 'nonce=""', docs.content.decode())
    assert "swagger-ui" in html and "cdn" not in html.lower() and "https://" not in html


@pytest.mark.django_db
def test_seed_demo_is_idempotent_and_uses_given_credentials(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], settings: Any,
) -> None:
    set_env(settings, "DEMO_API_KEY", "aok_0123abcd_fixed-demo-key-for-tests")
    set_env(settings, "DEMO_PASSWORD", "fixed-demo-password")
    call_command("seed_demo")
    call_command("seed_demo")
    out = capsys.readouterr().out
    assert "aok_0123abcd_fixed-demo-key-for-tests" in out and "fixed-demo-password" in out
    assert find_api_key("aok_0123abcd_fixed-demo-key-for-tests") is not None
    from django.contrib.auth import get_user_model

    from agents.models import Agent

    assert get_user_model().objects.get(username="approver").check_password("fixed-demo-password")
    assert get_user_model().objects.get(username="approver").has_perm("approvals.reveal_sensitive_fields")
    from audit.models import ConfigChange

    assert ConfigChange.objects.filter(action="approval.reveal_granted").count() == 1, "granted once, however often seeded"
    assert Agent.objects.filter(tenant__slug="demo", slug="order-assistant").count() == 1
