"""The smaller holes of the security review: /metrics token, the decision's redirect, the socket's Origin port, one CSP."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts import services as tenant_services
from agents.services import start_run
from approvals.models import ApprovalRequest
from tenants.models import Role
from tenants.scoping import actor_for_api_key
from tenants.ws_auth import origin_allowed
from tests.factories import World, make_user

pytestmark = pytest.mark.django_db

TOKEN = "scrape-token-0123456789abcdef"


def test_metrics_need_the_token_when_one_is_configured(client: Any, settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong-token").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401
    denied = client.get("/metrics")
    assert denied["WWW-Authenticate"].startswith("Bearer") and b"agentops_" not in denied.content
    allowed = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert allowed.status_code == 200 and b"# TYPE" in allowed.content


def test_metrics_without_a_token_configured_are_open_and_check_deploy_says_so(client: Any, settings: Any) -> None:
    from config.checks import metrics_token_set

    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 200
    assert [w.id for w in metrics_token_set()] == ["agentops.W001"]
    settings.METRICS_TOKEN = TOKEN
    assert metrics_token_set() == []


def _pending_request(world: World) -> ApprovalRequest:
    run = start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="refund order O202411280001")
    return ApprovalRequest.objects.create(
        tenant=world.tenant, run=run, step=1, call_id="call-1", tool_name="refund_order", arguments={"order_id": "O202411280001"},
        arguments_hash="0" * 64, expires_at=timezone.now() + timedelta(minutes=10),
    )


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/approvals/", "http://testserver.evil.example/",
                                    "javascript:alert(1)"])
def test_the_decision_never_redirects_off_site(client: Any, world: World, target: str) -> None:
    approver = make_user()
    tenant_services.set_membership(tenant=world.tenant, user=approver, role=Role.APPROVER, actor=None)
    request = _pending_request(world)
    client.force_login(approver)
    response = client.post(f"/approvals/{request.pk}/decide", {"decision": "reject", "note": "no", "next": target})
    assert response.status_code == 302
    assert response["Location"] == "/approvals/"


def test_the_decision_goes_back_to_a_page_of_this_site(client: Any, world: World) -> None:
    approver = make_user()
    tenant_services.set_membership(tenant=world.tenant, user=approver, role=Role.APPROVER, actor=None)
    request = _pending_request(world)
    client.force_login(approver)
    response = client.post(f"/approvals/{request.pk}/decide", {"decision": "reject", "note": "no", "next": f"/approvals/{request.pk}/"})
    assert response.status_code == 302 and response["Location"] == f"/approvals/{request.pk}/"


@pytest.mark.parametrize(("origin", "host", "scheme", "allowed"), [
    (b"http://127.0.0.1:8000", b"127.0.0.1:8000", "ws", True),
    (b"http://127.0.0.1:9999", b"127.0.0.1:8000", "ws", False),  # another port of the same host is another site
    (b"http://127.0.0.1", b"127.0.0.1:8000", "ws", False),
    (b"http://127.0.0.1:80", b"127.0.0.1", "ws", True),  # the default port, spelled or not
    (b"https://localhost", b"localhost", "wss", True),
    (b"https://localhost:8443", b"localhost", "wss", False),
    (b"https://evil.example", b"127.0.0.1:8000", "ws", False),
    (b"null", b"127.0.0.1:8000", "ws", False),
    (b"http://127.0.0.1:8000", None, "ws", False),
])
def test_a_session_socket_needs_the_servers_own_origin_port_included(
    settings: Any, origin: bytes, host: bytes | None, scheme: str, allowed: bool
) -> None:
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
    settings.CSRF_TRUSTED_ORIGINS = []
    assert origin_allowed(origin, host, scheme) is allowed


def test_a_trusted_origin_must_match_with_its_port(settings: Any) -> None:
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.com"]
    assert origin_allowed(b"https://console.example.com", b"internal:8000", "ws")
    assert not origin_allowed(b"https://console.example.com:4444", b"internal:8000", "ws")


@pytest.mark.parametrize("path", ["/admin/login/", "/api/docs/", "/accounts/login/", "/console/runs/", "/approvals/"])
def test_every_page_carries_one_csp_without_unsafe_inline_script(client: Any, world: World, path: str) -> None:
    if not path.startswith(("/admin/login", "/accounts/login")):
        client.force_login(world.operator)
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    policy = response["Content-Security-Policy"]
    directives = dict([*d.strip().split(" ", 1), ""][:2] for d in policy.split(";") if d.strip())
    assert "'unsafe-inline'" not in directives["script-src"] and "'unsafe-eval'" not in directives["script-src"]
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"


def test_the_api_docs_need_no_inline_script_and_their_style_carries_the_nonce(client: Any, world: World) -> None:
    client.force_login(world.operator)
    response = client.get("/api/docs/")
    html = response.content.decode()
    nonce = response["Content-Security-Policy"].split("'nonce-", 1)[1].split("'", 1)[0]
    assert f'<style nonce="{nonce}">' in html
    assert "<script>" not in html  # every script is a file
    script = client.get("/api/docs/?script=")
    assert script.status_code == 200 and b"SwaggerUIBundle" in script.content
