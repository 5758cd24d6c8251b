"""Approval notifications end to end: a live run hits an approval, the workers notify a local webhook sink (a signed
Slack body and a signed JSON body, the JSON one retried after the sink first answers 500) and mail the approvers;
the approver follows the link to the request and decides."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from accounts import services as tenant_services
from approvals import notify
from approvals.models import Delivery
from tenants.models import Role
from tests.factories import World, make_user, make_world
from tests.support.live_stack import LiveStack, make_live_stack
from tests.support.refund_target import add_refund_tool, serve_refund_target

pytestmark = pytest.mark.integration

SIGNING_SECRET = "whsec-live-0123456789abcdef-never-shown"
PUBLIC = "https://console.example.test"
ORDER = "O202411280042"


class WebhookSink:
    """A threaded HTTP server on 127.0.0.1 recording every POST; ``/json`` answers 500 to its first request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                with sink.lock:
                    earlier = sum(1 for r in sink.requests if r["path"] == self.path)
                    sink.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                          "body": body})
                status = 500 if self.path == "/json" and earlier == 0 else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def at(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r["path"] == path]


@pytest.fixture(scope="module")
def sink() -> Iterator[WebhookSink]:
    server = WebhookSink()
    yield server
    server.server.shutdown()


@pytest.fixture(scope="module")
def maildir() -> Path:
    return Path(tempfile.mkdtemp(prefix="agentops-mail-"))


@pytest.fixture(scope="module")
def notice_stack(django_db_setup: Any, django_db_blocker: Any, maildir: Path) -> Iterator[LiveStack]:
    stack = make_live_stack({
        "TOOL_EGRESS_ALLOW": "127.0.0.1",  # the deployment allows the local sink, as for tools' local servers
        "NOTIFY_SECRET_HOOKS": SIGNING_SECRET,
        "PUBLIC_BASE_URL": PUBLIC,
        "NOTIFY_RETRY_BASE_SECONDS": "0.5",
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",  # the workers' outbox, readable here
        "EMAIL_FILE_PATH": str(maildir),
    })
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def desk(notice_stack: LiveStack, django_db_blocker: Any) -> Iterator[tuple[World, str, str]]:
    with serve_refund_target() as target, django_db_blocker.unblock():
        world = make_world()
        world.tenant.settings = {**world.tenant.settings, "notify_secrets": ["HOOKS"]}  # granted by the platform
        world.tenant.save(update_fields=["settings"])
        tool = add_refund_tool(world, target)
        tool.sensitive_fields = ["order_id"]
        tool.save(update_fields=["sensitive_fields"])
        approver = make_user(email="approver@example.test")
        tenant_services.set_membership(tenant=world.tenant, user=approver, role=Role.APPROVER, actor=None)
        world.approver = approver  # type: ignore[attr-defined]
        _key, approver_key = tenant_services.create_api_key(tenant=world.tenant, name="approver", owner=approver,
                                                            role=Role.APPROVER, actor=None)
        yield world, approver_key, target


def _wait(what: str, check: Any, timeout: float = 40) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_live_approval_is_announced_signed_retried_mailed_and_decided_from_its_link(
    notice_stack: LiveStack, desk: tuple[World, str, str], sink: WebhookSink, maildir: Path, unblocked_db: None
) -> None:
    stack = notice_stack
    world, approver_key, _target = desk
    with stack.client(world.raw_key) as http:
        for body in (
            {"name": "slack", "kind": "webhook_slack", "target": f"{sink.url}/slack", "events": ["arrived"],
             "secret": "secret:HOOKS", "tools": ["refund_order"]},
            {"name": "json", "kind": "webhook_json", "target": f"{sink.url}/json", "events": ["arrived"], "secret": "secret:HOOKS"},
            {"name": "mail", "kind": "email", "events": ["arrived"]},
            {"name": "not-refunds", "kind": "email", "events": ["arrived"], "tools": ["query_order"]},
        ):
            created = http.post("/api/v1/notification-channels", json=body)
            assert created.status_code == 201, created.text
        started = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": f"please refund order {ORDER}"})
    assert started.status_code == 202, started.text
    run = stack.wait_for_run(world.raw_key, started.json()["id"], statuses=("waiting", "finished"))
    assert run["status"] == "waiting", run

    # the JSON sink failed first, so the worker tried again after the backoff
    deliveries = _wait("every delivery sent", lambda: (
        rows if len(rows := list(Delivery.objects.filter(tenant=world.tenant).select_related("channel"))) == 3
        and all(d.status == "sent" for d in rows) else None))
    by_channel = {d.channel.name: d for d in deliveries}
    assert by_channel["json"].attempts == 2 and by_channel["json"].response_code == 200
    assert by_channel["slack"].attempts == 1 and by_channel["mail"].attempts == 1
    json_posts, slack_posts = sink.at("/json"), sink.at("/slack")
    assert len(json_posts) == 2 and len(slack_posts) == 1

    for post in (*json_posts, *slack_posts):
        headers = post["headers"]
        assert headers["x-agentops-signature"] == notify.sign(SIGNING_SECRET, headers["x-agentops-timestamp"], post["body"].encode())
        assert ORDER not in post["body"] and SIGNING_SECRET not in post["body"]  # the tool marks order_id sensitive
    notice = json.loads(json_posts[-1]["body"])
    approval_id = notice["approval"]["id"]
    link = f"{PUBLIC}/approvals/{approval_id}/"
    assert notice["event"] == "approval.arrived" and notice["url"] == link and notice["approval"]["tool"] == "refund_order"
    slack = json.loads(slack_posts[0]["body"])
    assert link in slack["text"] and slack["blocks"][-1]["elements"][0]["url"] == link

    mails = "".join(p.read_text() for p in maildir.iterdir())
    assert "approver@example.test" in mails and link in mails and ORDER not in mails

    # the approver follows the link: the id in it is the request they decide
    assert link.startswith(PUBLIC + "/approvals/")
    with stack.client(approver_key) as http:
        assert http.get(f"/api/v1/approvals/{approval_id}").json()["status"] == "pending"
        decided = http.post(f"/api/v1/approvals/{approval_id}/approve", json={"note": "ok from the notice"})
    assert decided.status_code == 200, decided.text
    finished = stack.wait_for_run(world.raw_key, run["id"])
    assert finished["status"] == "finished"
    server_logs = "".join(p.read_text(errors="replace") for p in stack.logdir.glob("*.log"))
    assert SIGNING_SECRET not in server_logs
