"""Issue #50, hole 1: a flow's write runs once however often its node is tried.

A tool node's call has one identity on every attempt (``fl:<run>:<node>``, a map item's node id holds its index),
whatever the run's step counter says by then. A node whose completion was lost (the worker died after the write
reached its target, before the node's commit) is started again once its lease expires: the gateway finds the
write's ``started`` row by that identity, does not call a non-idempotent tool again, reports ``outcome_unknown``
and the run is marked for an operator; an idempotent tool runs again under the same ledger row and key.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Annotated, Any

import pytest
from django.utils import timezone

from agents import services
from agents.models import Run, RunEvent
from audit.chain import verify_tenant
from audit.models import ToolCallAudit
from flows import commit
from flows.models import FlowNodeRun
from flows.runner import call_id, execute_node
from tests.db.test_flow_runs import in_flight, make_flow, start
from tests.factories import World, make_world
from tools.pyfunc import Param, registry, tool
from tools.services import install_python_tool

pytestmark = pytest.mark.django_db

#: How often each test write reached its "target", per order.
CALLS: Counter[str] = Counter()
ORDER = "O202411280001"

if "test.flowonce.refund" not in registry:

    @tool(key="test.flowonce.refund", name="flowonce_refund", category="write", idempotent=False)
    def flowonce_refund(order_id: Annotated[str, Param(description="The order.")]) -> dict[str, Any]:
        """Refund an order (a side effect, not idempotent)."""
        CALLS[order_id] += 1
        return {"refunded": order_id}

    @tool(key="test.flowonce.put", name="flowonce_put", category="write", idempotent=True)
    def flowonce_put(order_id: Annotated[str, Param(description="The order.")]) -> dict[str, Any]:
        """Set an order's state (a side effect its target dedupes by idempotency key)."""
        CALLS[order_id] += 1
        return {"set": order_id}


class WorkerDied(BaseException):
    """Stands for SIGKILL: nothing in the worker catches it, so the node keeps its lease until it expires."""


@pytest.fixture
def world() -> World:
    CALLS.clear()
    world = make_world()
    for key in ("test.flowonce.refund", "test.flowonce.put"):
        install_python_tool(tenant=world.tenant, key=key, actor=None)
    return world


def _lose_the_first_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node runs (its write reaches the target), then its worker dies before the completion commits."""
    complete = commit.complete
    lost: list[bool] = []

    def dies_once(*args: Any, **kwargs: Any) -> None:
        if not lost:
            lost.append(True)
            raise WorkerDied
        complete(*args, **kwargs)

    monkeypatch.setattr(commit, "complete", dies_once)


def _retry_after_the_lease_expired(run_id: str, node_id: str) -> None:
    """The sweeper's re-enqueue: the node's lease has expired, advance starts it again (a new token), its task runs."""
    FlowNodeRun.objects.filter(run_id=run_id, node_id=node_id).update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    services.execute_run(run_id)
    [(started, token)] = [(n, t) for n, t in in_flight(Run.objects.get(pk=run_id)) if "[" in n or "[" not in node_id]
    assert started == node_id
    execute_node(run_id, node_id, token)


def _first_attempt_dies(world: World, monkeypatch: pytest.MonkeyPatch, tool_name: str) -> tuple[str, int]:
    make_flow(world, {"nodes": [{"id": "refund", "kind": "tool", "tool": tool_name, "inputs": {"order_id": "input.order_id"}}],
                      "output": "nodes.refund"}, slug="refund")
    run_id = start(world, {"flow": "refund", "input": {"order_id": ORDER}}).json()["id"]
    services.execute_run(run_id)
    [(node_id, token)] = in_flight(Run.objects.get(pk=run_id))
    _lose_the_first_completion(monkeypatch)
    with pytest.raises(WorkerDied):
        execute_node(run_id, node_id, token)
    assert CALLS[ORDER] == 1  # the write reached its target; its ledger row stays "started"
    started = ToolCallAudit.objects.get(run_id=run_id)
    assert started.status == "started" and started.call_id == call_id(run_id, "refund")
    return run_id, started.step


def test_a_non_idempotent_flow_write_whose_completion_was_lost_is_not_repeated_and_needs_attention(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, first_step = _first_attempt_dies(world, monkeypatch, "flowonce_refund")
    _retry_after_the_lease_expired(run_id, "refund")
    run = Run.objects.get(pk=run_id)
    assert run.step != first_step  # the run's step counter moved between the attempts: the ledger must not key on it
    assert CALLS[ORDER] == 1, "the retried node called the non-idempotent write again"
    [row] = ToolCallAudit.objects.filter(run_id=run_id)  # the started row completed, no second one
    assert row.status == "outcome_unknown" and row.call_id == call_id(run_id, "refund")
    assert run.status == "finished" and run.terminal_reason == "error" and "outcome_unknown" in run.error
    assert run.needs_attention
    [reason] = run.attention_reasons
    assert reason["kind"] == "outcome_unknown" and reason["call_id"] == call_id(run_id, "refund") and reason["audit_id"] == row.pk
    marks = RunEvent.objects.filter(run_id=run_id, type="run.needs_attention")
    assert marks.count() == 1 and marks.get().payload["call_id"] == call_id(run_id, "refund")
    assert verify_tenant(world.tenant.pk)[1] is None  # the completion kept the tenant's audit chain whole


def test_an_idempotent_flow_write_retried_after_a_lost_completion_keeps_its_ledger_row_and_key(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id, _ = _first_attempt_dies(world, monkeypatch, "flowonce_put")
    key = ToolCallAudit.objects.get(run_id=run_id).idempotency_key
    _retry_after_the_lease_expired(run_id, "refund")
    run = Run.objects.get(pk=run_id)
    [row] = ToolCallAudit.objects.filter(run_id=run_id)  # one ledger row for the call, not one per attempt
    assert row.status == "ok" and row.idempotency_key == key  # the target sees the same Idempotency-Key again
    assert run.terminal_reason == "final_answer" and not run.needs_attention
    assert verify_tenant(world.tenant.pk)[1] is None


def test_a_map_item_s_write_is_keyed_by_its_index_and_not_repeated_when_the_item_is_retried(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each item's call is its own (``each[<index>].refund``): item 0's lost completion leaves its row ``started``, item 1
    writes its own; item 0, started again, finds its own row, not item 1's, and does not write again."""
    other = "O202411280002"
    body = {"nodes": [{"id": "refund", "kind": "tool", "tool": "flowonce_refund", "inputs": {"order_id": "item"}}],
            "output": "nodes.refund"}
    make_flow(world, {"nodes": [{"id": "each", "kind": "map", "over": "input.orders", "body": body}],
                      "output": "nodes.each"}, slug="refunds")
    run_id = start(world, {"flow": "refunds", "input": {"orders": [ORDER, other]}}).json()["id"]
    services.execute_run(run_id)
    running = {n: t for n, t in in_flight(Run.objects.get(pk=run_id)) if "[" in n}  # the map's items' nodes
    assert set(running) == {"each[0].refund", "each[1].refund"}
    _lose_the_first_completion(monkeypatch)
    with pytest.raises(WorkerDied):
        execute_node(run_id, "each[0].refund", running["each[0].refund"])
    execute_node(run_id, "each[1].refund", running["each[1].refund"])
    _retry_after_the_lease_expired(run_id, "each[0].refund")
    assert (CALLS[ORDER], CALLS[other]) == (1, 1), CALLS
    rows = {r.call_id: r.status for r in ToolCallAudit.objects.filter(run_id=run_id)}
    assert rows == {call_id(run_id, "each[0].refund"): "outcome_unknown", call_id(run_id, "each[1].refund"): "ok"}
    run = Run.objects.get(pk=run_id)
    assert run.needs_attention and [r["call_id"] for r in run.attention_reasons] == [call_id(run_id, "each[0].refund")]


def test_a_write_another_run_of_the_session_started_and_never_completed_blocks_the_same_write(world: World) -> None:
    """The duplicate guard counts a ``started`` row of another call (under way, or its outcome unknown) as done."""
    make_flow(world, {"nodes": [{"id": "refund", "kind": "tool", "tool": "flowonce_refund",
                                 "inputs": {"order_id": "input.order_id"}}]}, slug="refund")
    first = start(world, {"flow": "refund", "input": {"order_id": ORDER}}).json()["id"]
    services.execute_run(first)
    [(node_id, token)] = in_flight(Run.objects.get(pk=first))
    execute_node(first, node_id, token)
    row = ToolCallAudit.objects.get(run_id=first)
    ToolCallAudit.objects.filter(pk=row.pk).update(status="started")  # as a completion that was lost leaves it
    second = Run.objects.get(pk=start(world, {"flow": "refund", "input": {"order_id": ORDER}}).json()["id"])
    Run.objects.filter(pk=second.pk).update(session=Run.objects.get(pk=first).session)  # the same conversation
    services.execute_run(str(second.pk))
    [(node_id, token)] = in_flight(Run.objects.get(pk=second.pk))
    execute_node(str(second.pk), node_id, token)
    assert CALLS[ORDER] == 1, "the same write was sent again while the first one's outcome is unknown"
    blocked = ToolCallAudit.objects.get(run_id=second.pk)
    assert blocked.status == "duplicate_blocked" and "outcome is unknown" in blocked.error
