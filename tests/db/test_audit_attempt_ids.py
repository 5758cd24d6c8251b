"""Issue #13 item 4: an audit row joins the run's message log even after a crash-resumed write.

A step resumed after a crash asks the model again, and the model names the same call with a new id. The
write's ``started`` row is found by run, step and arguments (tools/gateway.py), completed by the resumed
step, and must then carry every id: ``attempt_call_ids`` lists them first attempt first, and the last one
(also the row's ``call_id``) is the one the committed message log holds. One join rule for every row:
``RunMessage.message["tool_call_id"] in ToolCallAudit.attempt_call_ids``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Annotated, Any

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from agents import services
from agents.models import RunMessage
from audit import chain
from audit.chain import verify_tenant, write_sealed
from audit.models import ToolCallAudit
from audit.unit_of_work import StepAudit
from runtime.types import ToolCall, ToolContext, ToolOutcome, ToolStatus
from tenants.scoping import actor_for_api_key
from tests.factories import World, make_world
from tools.gateway import AuditWrite, ToolGateway
from tools.models import Tool
from tools.pyfunc import Param, registry, tool
from tools.services import install_python_tool

pytestmark = pytest.mark.django_db

#: How often the test write tool ran, per text: a side effect we can count.
WRITES: Counter[str] = Counter()

if "test.attempts.write" not in registry:

    @tool(key="test.attempts.write", name="record_refund", category="write", idempotent=True)
    def record_refund(order_id: Annotated[str, Param(description="The order.")]) -> dict[str, Any]:
        """Record a refund (a side effect, idempotent by key). Used to test crash-resumed writes."""
        WRITES[order_id] += 1
        return {"refunded": order_id}


@pytest.fixture
def world() -> World:
    WRITES.clear()
    return make_world()


def _write_tool(world: World, *, idempotent: bool = True) -> Tool:
    row = install_python_tool(tenant=world.tenant, key="test.attempts.write", actor=None, idempotent=idempotent)
    return row


def _attempt(world: World, run: Any, tool_row: Tool, call_id: str, *, step: int = 1) -> tuple[ToolOutcome, list[AuditWrite]]:
    """One attempt of the step: the model named the call ``call_id``; the gateway runs it into a fresh buffer."""
    buffer = StepAudit()
    run.version.tools = [tool_row.name]
    gateway = ToolGateway(run=run, tools=[tool_row], audit=buffer)
    call = ToolCall(call_id, tool_row.name, json.dumps({"order_id": "O202411280001"}))
    return gateway.execute(call, ToolContext(run_id=str(run.pk), step=step, span_id="s")), buffer


def _commit_step(world: World, run: Any, buffer: StepAudit, call_id: str, outcome: ToolOutcome) -> None:
    """What the run store commits for the step: the assistant's call, its tool message and the audit rows."""
    with transaction.atomic():
        count = RunMessage.objects.filter(run=run).count()
        RunMessage.objects.bulk_create([
            RunMessage(tenant=world.tenant, run=run, index=count, step=1, message={
                "role": "assistant", "content": "",
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "record_refund", "arguments": "{}"}}],
            }),
            RunMessage(tenant=world.tenant, run=run, index=count + 1, step=1, message={
                "role": "tool", "tool_call_id": call_id, "name": "record_refund", "content": outcome.content,
            }),
        ])
        write_sealed(buffer, world.tenant.pk)


def _joined(run: Any) -> dict[int, list[str]]:
    """Each audit row of the run and the tool messages it joins (tool_call_id in attempt_call_ids)."""
    tool_ids = [m["tool_call_id"] for m in RunMessage.objects.filter(run=run).values_list("message", flat=True)
                if m.get("role") == "tool"]
    return {row.pk: [i for i in tool_ids if i in row.attempt_call_ids] for row in ToolCallAudit.objects.filter(run=run)}


def _run(world: World) -> Any:
    return services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="refund O202411280001")


def test_a_crash_resumed_write_records_both_ids_and_joins_the_message_log(world: World) -> None:
    tool_row = _write_tool(world)
    run = _run(world)
    # given a write whose started row was committed at step 1 under call id A, and a worker that died before the step committed
    _outcome, _lost = _attempt(world, run, tool_row, "call_A")
    started = ToolCallAudit.objects.get(run=run)
    assert (started.status, started.call_id, started.attempt_call_ids) == ("started", "call_A", ["call_A"])
    # when the step is executed again and the model names the same call B, with the same arguments
    outcome, buffer = _attempt(world, run, tool_row, "call_B")
    assert outcome.status == ToolStatus.OK and WRITES["O202411280001"] == 2, "idempotent: replayed with the same key"
    _commit_step(world, run, buffer, "call_B", outcome)
    # then the one audit row (the started row, completed) lists both ids, first first, the last one the message log's
    row = ToolCallAudit.objects.get(run=run)
    assert row.pk == started.pk and row.status == "ok"
    assert row.attempt_call_ids == ["call_A", "call_B"]
    assert row.call_id == "call_B", "call_id is the id of the attempt whose messages were committed"
    assert row.idempotency_key == started.idempotency_key == f"{run.pk}:1:call_A", "the key still names the first attempt"
    assert _joined(run) == {row.pk: ["call_B"]}
    # and the chain verifies: the sealed hash covers what the database holds (both ids, the resumed call id)
    assert verify_tenant(world.tenant.pk) == (1, None)


def test_a_non_idempotent_write_reported_outcome_unknown_joins_too(world: World) -> None:
    tool_row = _write_tool(world, idempotent=False)
    run = _run(world)
    _attempt(world, run, tool_row, "call_A")
    outcome, buffer = _attempt(world, run, tool_row, "call_B")
    assert outcome.status == ToolStatus.OUTCOME_UNKNOWN and WRITES["O202411280001"] == 1
    _commit_step(world, run, buffer, "call_B", outcome)
    row = ToolCallAudit.objects.get(run=run)
    assert (row.status, row.call_id, row.attempt_call_ids) == ("outcome_unknown", "call_B", ["call_A", "call_B"])
    assert _joined(run) == {row.pk: ["call_B"]}
    assert verify_tenant(world.tenant.pk) == (1, None)


def test_every_attempt_is_kept_through_two_crashes_and_a_repeated_id_is_not_doubled(world: World) -> None:
    tool_row = _write_tool(world)
    run = _run(world)
    _attempt(world, run, tool_row, "call_A")  # crash 1
    _attempt(world, run, tool_row, "call_B")  # crash 2: its id is noted on the started row at once
    assert ToolCallAudit.objects.get(run=run).attempt_call_ids == ["call_A", "call_B"]
    outcome, buffer = _attempt(world, run, tool_row, "call_C")
    _commit_step(world, run, buffer, "call_C", outcome)
    row = ToolCallAudit.objects.get(run=run)
    assert (row.call_id, row.attempt_call_ids) == ("call_C", ["call_A", "call_B", "call_C"])
    assert _joined(run) == {row.pk: ["call_C"]}

    # a model that gives the same id again (the deterministic planner does) leaves one id
    run2 = _run(world)
    _attempt(world, run2, tool_row, "call_1_0")
    outcome, buffer = _attempt(world, run2, tool_row, "call_1_0")
    _commit_step(world, run2, buffer, "call_1_0", outcome)
    assert ToolCallAudit.objects.get(run=run2).attempt_call_ids == ["call_1_0"]
    assert verify_tenant(world.tenant.pk) == (2, None)


def test_ordinary_rows_list_their_one_id(world: World) -> None:
    run = _run(world)
    buffer = StepAudit()
    rows = list(Tool.objects.for_tenant(world.tenant))
    gateway = ToolGateway(run=run, tools=rows, audit=buffer)
    for call_id, name in (("c-read", "query_order"), ("c-unknown", "no_such_tool")):
        gateway.execute(ToolCall(call_id, name, '{"order_id": "O202411280001"}'), ToolContext(run_id=str(run.pk), step=1, span_id="s"))
    with transaction.atomic():
        write_sealed(buffer, world.tenant.pk)
    assert sorted((r.call_id, r.attempt_call_ids) for r in ToolCallAudit.objects.filter(run=run)) == [
        ("c-read", ["c-read"]), ("c-unknown", ["c-unknown"])]


def test_the_chain_covers_the_ids_and_rows_sealed_before_them_still_verify(world: World) -> None:
    run = _run(world)
    legacy = ToolCallAudit(tenant=world.tenant, run=run, step=1, call_id="old", tool_name="query_order", status="ok")
    assert legacy.attempt_call_ids == []
    # a row sealed before the field existed was hashed without it: the digest of an empty list is that same payload
    payload = {name: getattr(legacy, name) for name in chain.HASHED_FIELDS}
    payload.update(run_id=str(run.pk), session_id=None, created_at=legacy.created_at.isoformat(timespec="microseconds"))
    assert chain.digest(legacy) == chain._mac("tool-call chain", payload)
    current = ToolCallAudit(tenant=world.tenant, run=run, step=1, call_id="new", attempt_call_ids=["first", "new"],
                            tool_name="query_order", status="ok")
    with transaction.atomic():
        write_sealed([AuditWrite(legacy), AuditWrite(current)], world.tenant.pk)
    assert verify_tenant(world.tenant.pk) == (2, None)
    # editing the ids of a sealed row (even emptying them) breaks the chain at that row
    ToolCallAudit.objects.filter(call_id="new").update(attempt_call_ids=[])
    checked, broken = verify_tenant(world.tenant.pk)
    assert checked == 1 and broken is not None and "keyed hash" in broken.reason
    ToolCallAudit.objects.filter(call_id="new").update(attempt_call_ids=["first", "new"])
    ToolCallAudit.objects.filter(call_id="old").update(attempt_call_ids=["forged"])
    assert verify_tenant(world.tenant.pk)[1] is not None


def test_the_api_and_the_admin_show_the_attempt_ids(world: World) -> None:
    tool_row = _write_tool(world)
    run = _run(world)
    _attempt(world, run, tool_row, "call_A")
    outcome, buffer = _attempt(world, run, tool_row, "call_B")
    _commit_step(world, run, buffer, "call_B", outcome)
    row = ToolCallAudit.objects.get(run=run)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    body = api.get(f"/api/v1/audit/tool-calls?run={run.pk}").json()["results"]
    assert [(r["call_id"], r["attempt_call_ids"]) for r in body] == [("call_B", ["call_A", "call_B"])]
    assert api.get(f"/api/v1/audit/tool-calls/{row.pk}").json()["attempt_call_ids"] == ["call_A", "call_B"]
    client = Client()
    client.force_login(world.operator)
    page = client.get(reverse("admin:audit_toolcallaudit_change", args=[row.pk]))
    assert page.status_code == 200
    assert "attempt_call_ids" in page.content.decode() and "call_A" in page.content.decode()
    assert client.post(reverse("admin:audit_toolcallaudit_change", args=[row.pk]), {"attempt_call_ids": "[]"}).status_code == 403
    assert ToolCallAudit.objects.get(pk=row.pk).attempt_call_ids == ["call_A", "call_B"]
