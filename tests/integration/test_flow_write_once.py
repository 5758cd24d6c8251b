"""Issue #50, hole 1, on the live stack (both run modes): a flow's write whose worker is SIGKILLed mid-call is sent once.

The flow's one node calls a non-idempotent HTTP refund tool; the target (tests/integration/test_write_exactly_once.py)
records the request at once and holds it, and the process running the node is SIGKILLed inside that window. The
node's lease expires, the sweeper's advance starts it again (attempt 2) at a later step of the run; the gateway finds
the write's ``started`` row by the node's call id and does not send it again: the node fails ``outcome_unknown``, and
the run, ended, needs an operator's attention naming that call.
"""

from __future__ import annotations

import time

import pytest

from agents.models import Run, RunEvent
from audit.chain import verify_tenant
from audit.models import ToolCallAudit
from flows.models import FlowNodeRun
from flows.runner import call_id
from tests.factories import make_world
from tests.integration.test_flows import FAST, _own, stacks  # noqa: F401 - the module's stacks fixture
from tests.integration.test_write_exactly_once import SlowRefundTarget, target  # noqa: F401 - the target fixture
from tests.support.live_stack import LiveStack, replace_executor
from tools.models import Tool, ToolCategory, ToolKind

pytestmark = pytest.mark.integration

ORDER = "O202411280051"


def _requests() -> list[dict[str, str]]:
    with SlowRefundTarget.lock:
        return [r for r in SlowRefundTarget.requests if r["path"] == f"/refunds/{ORDER}"]


def test_a_flow_write_cut_off_by_a_kill_is_sent_once_and_the_run_needs_attention(
    stacks: list[LiveStack], target: str, unblocked_db: None  # noqa: F811 - the fixtures imported above
) -> None:
    world = make_world()
    Tool.objects.create(
        tenant=world.tenant, name="refund_order", kind=ToolKind.HTTP, category=ToolCategory.WRITE, idempotent=False,
        requires_approval=False, timeout_seconds=10, description="Refund an order.",
        parameters={"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^O\\d{12}$"}},
                    "required": ["order_id"], "additionalProperties": False},
        config={"method": "POST", "url": target + "/refunds/{order_id}", "allow_hosts": ["127.0.0.1"]},
    )
    victim = _own(stacks)
    refund = {"id": "refund", "kind": "tool", "tool": "refund_order", "inputs": {"order_id": "input.order_id"},
              "timeout_seconds": 10}
    with victim.client(world.raw_key) as http:
        assert http.post("/api/v1/flows", json={"slug": "refund", "name": "refund"}).status_code == 201
        saved = http.post("/api/v1/flows/refund/versions", json={
            "model": "demo/planner", "definition": {"nodes": [refund], "output": "nodes.refund"}, "make_current": True})
        assert saved.status_code == 201, saved.text
        response = http.post("/api/v1/runs", json={"flow": "refund", "input": {"order_id": ORDER}})
    assert response.status_code == 202, response.text
    run_id = str(response.json()["id"])
    deadline = time.monotonic() + 30
    while not _requests():  # the write reached the target, which holds it unanswered
        assert time.monotonic() < deadline, f"the target got no request for {ORDER}"
        time.sleep(0.02)
    started = ToolCallAudit.objects.get(run_id=run_id)
    assert started.status == "started", "the intent is committed before the request is sent"
    victim.kill_executor()  # production: the worker process; embedded: the server and its worker thread
    assert FlowNodeRun.objects.get(run_id=run_id, node_id="refund").status == "running", "killed before it committed"
    successor = replace_executor(victim, stacks, FAST)
    body = successor.wait_for_run(world.raw_key, run_id, timeout=90)
    # the node ran again (a later step of the run), and the target still got the write once
    assert FlowNodeRun.objects.get(run_id=run_id, node_id="refund").attempt == 2
    assert Run.objects.get(pk=run_id).step > started.step
    assert len(_requests()) == 1, _requests()
    [row] = ToolCallAudit.objects.filter(run_id=run_id)
    assert row.pk == started.pk and row.status == "outcome_unknown" and row.call_id == call_id(run_id, "refund")
    assert row.idempotency_key == _requests()[0]["key"]
    assert verify_tenant(world.tenant.pk)[1] is None
    assert body["terminal_reason"] == "error" and body["needs_attention"] is True, body
    [reason] = body["attention_reasons"]
    assert (reason["kind"], reason["call_id"], reason["audit_id"]) == ("outcome_unknown", call_id(run_id, "refund"), row.pk)
    assert RunEvent.objects.filter(run_id=run_id, type="run.needs_attention").count() == 1
