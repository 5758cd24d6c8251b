"""The tool gateway's stages, one by one, each failure with its audit status (in-process, real database)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

import tests.support.tools  # noqa: F401 - registers the test tools
from agents import services
from audit.chain import verify_tenant, write_sealed
from audit.models import ToolCallAudit
from audit.unit_of_work import StepAudit
from runtime.types import ToolCall, ToolContext, ToolStatus
from tenants.scoping import actor_for_api_key
from tests.factories import World
from tests.support.deployment import set_env
from tools.gateway import AuditWrite, ToolGateway
from tools.models import Tool, ToolCategory, ToolKind
from tools.services import install_python_tool

pytestmark = pytest.mark.django_db


class Target(BaseHTTPRequestHandler):
    """A tool target that counts requests per Idempotency-Key and records headers."""

    counts: Counter[str] = Counter()
    headers_seen: list[dict[str, str]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        Target.counts[self.headers.get("Idempotency-Key", "")] += 1
        Target.headers_seen.append(dict(self.headers))
        payload = json.dumps({"refund_id": "R-1", "order_id": body.get("order_id"), "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def target() -> Iterator[str]:
    Target.counts.clear()
    Target.headers_seen.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _run(world: World, **facts: Any) -> Any:
    return services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="hi", facts=facts)


def _gateway(
    world: World, run: Any, *, tools: list[Tool] | None = None, grants: set[str] | None = None
) -> tuple[ToolGateway, list[AuditWrite]]:
    buffer = StepAudit()
    rows = tools if tools is not None else list(Tool.objects.for_tenant(world.tenant))
    run.version.tools = [t.name for t in rows]
    return ToolGateway(run=run, tools=rows, audit=buffer, grants=grants), buffer


def _call(gw: ToolGateway, name: str, arguments: Any, *, step: int = 1, call_id: str = "c1") -> Any:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return gw.execute(ToolCall(call_id, name, raw), ToolContext(run_id="r", step=step, span_id="s"))


def _commit(buffer: Any, tenant_id: int) -> list[ToolCallAudit]:
    with transaction.atomic():
        write_sealed(buffer, tenant_id)
    return list(ToolCallAudit.objects.filter(tenant_id=tenant_id).order_by("chain_seq"))


def test_unknown_disabled_and_unlisted_tools_are_denied_and_audited(world: World) -> None:
    run = _run(world)
    gw, buffer = _gateway(world, run)
    assert _call(gw, "delete_everything", {}).status == ToolStatus.DENIED
    Tool.objects.filter(tenant=world.tenant, name="query_order").update(enabled=False)
    gw, buffer2 = _gateway(world, run)
    disabled = _call(gw, "query_order", {"order_id": "O202411280001"})
    assert disabled.status == ToolStatus.DENIED and "switched off" in disabled.content
    gw.whitelist.discard("query_logistics")
    unlisted = _call(gw, "query_logistics", {"order_id": "O202411280001"})
    assert unlisted.status == ToolStatus.DENIED and "may not use" in unlisted.content
    rows = _commit([*buffer, *buffer2], world.tenant.pk)
    assert [r.status for r in rows] == ["denied", "denied", "denied"]
    assert all(r.error for r in rows)


def test_required_scopes_must_be_granted_to_the_session(world: World) -> None:
    Tool.objects.filter(tenant=world.tenant, name="query_order").update(required_scopes=["orders:read"])
    run = _run(world)
    gw, _ = _gateway(world, run)
    denied = _call(gw, "query_order", {"order_id": "O202411280001"})
    assert denied.status == ToolStatus.DENIED and "orders:read" in denied.content
    gw, _ = _gateway(world, run, grants={"orders:read"})
    assert _call(gw, "query_order", {"order_id": "O202411280001"}).status == ToolStatus.OK


def test_broken_json_and_drifted_field_names_are_repaired(world: World) -> None:
    gw, _ = _gateway(world, _run(world))
    repaired = _call(gw, "query_order", "{'order_id': 'O202411280001',")
    assert repaired.status == ToolStatus.OK and "Longjing" in repaired.content
    mapped = _call(gw, "query_order", {"orderId": "O202411280001"})
    assert mapped.status == ToolStatus.OK
    validate = next(t for t in mapped.trace if t.get("stage") == "validate")
    assert validate["mapped"] == [["orderId", "order_id"]]


def test_invalid_arguments_get_a_readable_message_and_the_model_is_told_to_stop_after_two(world: World) -> None:
    gw, buffer = _gateway(world, _run(world))
    first = _call(gw, "query_order", {"order_id": "12345"})
    assert first.status == ToolStatus.INVALID
    assert "order_id" in first.content and "O\\d{12}" in first.content and "12345" in first.content
    second = _call(gw, "query_order", {"order_id": "12345"}, call_id="c2")
    assert "stop calling query_order" in second.content
    assert [w.row.status for w in buffer] == ["invalid", "invalid"]


def test_a_write_repeated_with_the_same_arguments_is_blocked(world: World) -> None:
    install_python_tool(tenant=world.tenant, key="test.note", actor=None)
    run = _run(world)
    gw, buffer = _gateway(world, run)
    assert _call(gw, "note", {"text": "call back"}, step=1).status == ToolStatus.OK
    _commit(buffer, world.tenant.pk)
    buffer.discard()
    again = _call(gw, "note", {"text": "call back"}, step=2, call_id="c9")
    assert again.status == ToolStatus.DUPLICATE_BLOCKED and "already did this" in again.content
    assert _call(gw, "note", {"text": "something else"}, step=2, call_id="c10").status == ToolStatus.OK


def test_a_slow_tool_times_out_with_a_warning_for_the_model(world: World) -> None:
    install_python_tool(tenant=world.tenant, key="test.slow", actor=None, timeout_seconds=0.2)
    gw, buffer = _gateway(world, _run(world))
    outcome = _call(gw, "slow", {"seconds": 2})
    assert outcome.status == ToolStatus.TIMEOUT
    assert "Do not tell the user it succeeded" in outcome.content
    assert buffer[0].row.status == "timeout"


def _http_tool(world: World, url: str, *, idempotent: bool, allow: list[str] | None = None) -> Tool:
    return Tool.objects.create(
        tenant=world.tenant,
        name="refund_order",
        description="Refund an order.",
        kind=ToolKind.HTTP,
        category=ToolCategory.WRITE,
        idempotent=idempotent,
        parameters={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        config={
            "method": "POST",
            "url": url + "/refunds/{order_id}",
            "headers": {"Authorization": "Bearer {secret:REFUNDS}"},
            "allow_hosts": allow or [],
        },
    )


def test_http_tools_send_an_idempotency_key_and_secrets_never_reach_audit_or_trace(
    world: World, target: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
, settings: Any) -> None:
    set_env(settings, "TOOL_SECRET_REFUNDS", "s3cr3t-refund-token-value")
    tool = _http_tool(world, target, idempotent=True, allow=["127.0.0.1"])
    run = _run(world)
    gw, buffer = _gateway(world, run, tools=[tool])
    outcome = _call(gw, "refund_order", {"order_id": "O202411280001"}, step=3)
    assert outcome.status == ToolStatus.OK, outcome.content
    assert Target.counts == Counter({f"{run.pk}:3:c1": 1})
    assert Target.headers_seen[0]["Authorization"] == "Bearer s3cr3t-refund-token-value"
    rows = _commit(buffer, world.tenant.pk)
    everything = (
        json.dumps([outcome.content, outcome.trace])
        + " ".join(f"{r.arguments_summary} {r.error}" for r in ToolCallAudit.objects.all())
        + caplog.text
    )
    assert "s3cr3t-refund-token-value" not in everything
    assert rows[-1].status == "ok" and rows[-1].idempotency_key == f"{run.pk}:3:c1"


def test_a_replayed_write_reuses_its_key_if_idempotent_and_is_not_repeated_otherwise(
    world: World, target: str, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    set_env(settings, "TOOL_SECRET_REFUNDS", "token")
    tool = _http_tool(world, target, idempotent=True, allow=["127.0.0.1"])
    run = _run(world)
    gw, _lost = _gateway(world, run, tools=[tool])
    _call(gw, "refund_order", {"order_id": "O202411280001"}, step=1)  # the worker "dies": the step never commits
    started = ToolCallAudit.objects.get(run=run, status="started")
    gw, buffer = _gateway(world, run, tools=[tool])
    assert _call(gw, "refund_order", {"order_id": "O202411280001"}, step=1).status == ToolStatus.OK
    assert Target.counts == Counter({started.idempotency_key: 2}), "the same key both times: the target dedupes"
    _commit(buffer, world.tenant.pk)
    assert ToolCallAudit.objects.get(pk=started.pk).status == "ok"
    assert ToolCallAudit.objects.filter(run=run).count() == 1

    Tool.objects.filter(pk=tool.pk).update(idempotent=False)
    tool.refresh_from_db()
    run2 = _run(world)
    gw, _lost = _gateway(world, run2, tools=[tool])
    _call(gw, "refund_order", {"order_id": "O202411280002"}, step=1)
    gw, buffer = _gateway(world, run2, tools=[tool])
    unknown = _call(gw, "refund_order", {"order_id": "O202411280002"}, step=1)
    assert unknown.status == ToolStatus.OUTCOME_UNKNOWN and "not repeated" in unknown.content
    assert sum(Target.counts.values()) == 3, "the non-idempotent call reached the target exactly once"
    _commit(buffer, world.tenant.pk)
    assert ToolCallAudit.objects.get(run=run2).status == "outcome_unknown"


@pytest.mark.parametrize("url", ["http://169.254.169.254", "http://127.0.0.1:9", "http://0x7f000001", "http://10.0.0.5"])
def test_http_tools_cannot_reach_internal_addresses_and_the_denial_is_audited(world: World, url: str) -> None:
    tool = _http_tool(world, url, idempotent=True)
    tool.category = ToolCategory.READ
    tool.save()
    gw, buffer = _gateway(world, _run(world), tools=[tool])
    outcome = _call(gw, "refund_order", {"order_id": "O202411280001"})
    assert outcome.status == ToolStatus.EGRESS_DENIED, outcome.content
    assert buffer[0].row.status == "egress_denied"


def test_sensitive_values_are_masked_in_audit_rows(world: World) -> None:
    install_python_tool(tenant=world.tenant, key="test.contact", actor=None)
    gw, buffer = _gateway(world, _run(world))
    _call(gw, "contact", {"phone": "13812345678", "name": "Li"})
    rows = _commit(buffer, world.tenant.pk)
    assert "13812345678" not in rows[-1].arguments_summary


def test_verify_audit_catches_an_edited_row(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    gw, buffer = _gateway(world, _run(world))
    for i in range(3):
        _call(gw, "query_order", {"order_id": "O202411280001"}, call_id=f"c{i}")
    rows = _commit(buffer, world.tenant.pk)
    assert verify_tenant(world.tenant.pk) == (3, None)
    ToolCallAudit.objects.filter(pk=rows[1].pk).update(status="error")
    with pytest.raises(CommandError):
        call_command("verify_audit", tenant=world.tenant.slug)
    out = capsys.readouterr().out
    assert f"BROKEN at audit row {rows[1].pk}" in out and "edited" in out


def test_a_conversation_holds_the_scopes_consented_for_the_tenants_plugins(world: World) -> None:
    from agents.engine import session_grants
    from marketplace.services import install_plugin
    from marketplace.sync import sync_catalog

    run = _run(world)
    assert "orders:refund" not in session_grants(run)
    sync_catalog()
    install_plugin(tenant=world.tenant, plugin_key="order-desk", actor=None)
    assert {"orders:read", "orders:refund"} <= session_grants(run)
    granted_by_client = _run(world, grants=["reports:export"])
    assert "reports:export" in session_grants(granted_by_client)
