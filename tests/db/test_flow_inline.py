"""Inline flow nodes (issue #15's overhead): tool and switch nodes marked ``inline`` run in the task that started them, a
wave at a time; a wave's completions, their events and audit rows and the next decision commit in one transaction."""

from __future__ import annotations

import datetime as dt
import json
import threading
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents import services
from agents.models import Run, RunEvent
from audit.models import ToolCallAudit
from flows import commit, nodes, runner, store
from flows.models import FlowNodeRun
from flows.nodes import tool as tool_node
from flows.runner import advance, call_id
from runtime.types import Event
from tests.db.test_flow_runs import ORDER, desk, lookup, make_flow, start
from tests.factories import World, make_world
from tools.models import Tool
from tools.pyfunc import registry, tool
from tools.services import install_python_tool

pytestmark = pytest.mark.django_db


def _run(world: World, slug: str, capture: Any) -> Run:
    run_id = start(world, {"flow": slug, "input": {"order_id": ORDER}}).json()["id"]
    with capture(execute=True):
        services.execute_run(run_id)
    return Run.objects.get(pk=run_id)


def test_an_inline_flow_runs_to_the_end_in_the_task_that_started_it(world: World, django_capture_on_commit_callbacks: Any) -> None:
    make_flow(world, {**desk(), "inline": True}, slug="inline-desk")
    run = _run(world, "inline-desk", django_capture_on_commit_callbacks)
    assert run.terminal_reason == "final_answer", run.error
    assert json.loads(run.output) == {"carrier": "SF Express", "big": "259.00", "small": None}
    rows = {r.node_id: r for r in FlowNodeRun.objects.filter(run=run)}
    assert {n: r.status for n, r in rows.items()} == {"order": "done", "logistics": "done", "route": "done", "big": "done",
                                                      "small": "skipped", "done": "done"}
    assert {r.attempt for r in rows.values() if r.status == "done"} == {1}
    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    finished = [e.payload for e in events if e.type == "flow.node.finished"]
    assert sorted(p["node"] for p in finished) == ["big", "done", "logistics", "order", "route"]
    assert all(p.get("inline") for p in finished), "each node ran inline"
    assert sorted(ToolCallAudit.objects.filter(run_id=run.pk).values_list("call_id", flat=True)) == sorted(
        call_id(run.pk, n) for n in ("big", "done", "logistics", "order"))


def test_a_node_can_opt_out_of_its_flows_inline_setting(world: World, django_capture_on_commit_callbacks: Any) -> None:
    definition = {**desk(), "inline": True}
    definition["nodes"] = [dict(n, inline=False) if n["id"] == "done" else n for n in definition["nodes"]]
    make_flow(world, definition, slug="mixed")
    run = _run(world, "mixed", django_capture_on_commit_callbacks)
    # the last node is a task of its own: enqueued, not run here (the tests' worker is not running)
    assert FlowNodeRun.objects.get(run=run, node_id="done").status == "running"
    assert FlowNodeRun.objects.get(run=run, node_id="big").status == "done"


def _wave_statements(world: World, width: int, capture: Any, settings: Any) -> int:
    settings.TENANT_MAX_RUNNING = 20
    wide = [lookup(f"n{i}", ["start"]) for i in range(width)]
    make_flow(world, {"nodes": [lookup("start"), *wide, lookup("join", [n["id"] for n in wide])], "max_parallel": 10,
                      "inline": True}, slug=f"inline{width}")
    run_id = start(world, {"flow": f"inline{width}", "input": {"order_id": ORDER}}).json()["id"]
    with CaptureQueriesContext(connection) as queries, capture(execute=True):
        services.execute_run(run_id)
    assert Run.objects.get(pk=run_id).terminal_reason == "final_answer"
    return len(queries)


def test_an_inline_wave_costs_one_statement_per_node_more(world: World, django_capture_on_commit_callbacks: Any,
                                                          settings: Any) -> None:
    """bench/flow_overhead.py's hot path: per wave a fixed set of statements, per node in it only its row's update."""
    _wave_statements(world, 1, django_capture_on_commit_callbacks, settings)  # creates the audit chain head: not measured
    two = _wave_statements(world, 2, django_capture_on_commit_callbacks, settings)
    ten = _wave_statements(world, 10, django_capture_on_commit_callbacks, settings)
    assert ten - two <= 8, f"8 more nodes in a wave took {ten - two} more statements: more than their rows' updates"


def test_an_inline_wave_writes_its_nodes_in_the_same_statements_however_wide_on_postgresql(
    world: World, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    """A wave's completions, audit rows, events and the next decision's writes go out as one statement (store.Writes,
    core/batch.py), so ten nodes in a wave cost what two do. PostgreSQL only (CI's database suite): on SQLite each
    write is a statement of its own, which the test above bounds."""
    if connection.vendor != "postgresql":
        pytest.skip("one statement per commit is PostgreSQL's (data-modifying CTEs); SQLite sends each write alone")
    _wave_statements(world, 1, django_capture_on_commit_callbacks, settings)  # creates the audit chain head: not measured
    two = _wave_statements(world, 2, django_capture_on_commit_callbacks, settings)
    ten = _wave_statements(world, 10, django_capture_on_commit_callbacks, settings)
    assert ten == two, f"a 10-wide wave took {ten - two} more statements than a 2-wide one"
    # 27: the run's lease and its first decision (9), the flow's tools and grants once (the first wave decides their
    # kill switch from that read), and per later wave the kill switch, the lock, the tenant's running nodes when it
    # starts more (counted after the lock: 26 when the lock counted them, from a snapshot older than the lock), the
    # writes (the test's savepoints included: 2 a transaction)
    assert two <= 27, f"{two} statements for a 4-node inline run (start, a 2-wide wave, join)"


def test_a_wave_reads_the_rows_again_when_another_writer_changed_the_run_meanwhile(
    world: World, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wave starts from the rows the transaction that started it left. If something else wrote to the run meanwhile
    (here: the sweeper restarted a node of the wave, new token, its event appended), the commit reads the rows again
    and drops that node's result instead of finishing it over the other's lease."""
    make_flow(world, {**desk(), "inline": True}, slug="raced")
    real = nodes.attempts

    def restarted_meanwhile(run: Any, flow: Any, node: Any, row: Any, *args: Any, **kwargs: Any) -> Any:
        if node.id == "big":
            from django.db import transaction

            with transaction.atomic():
                FlowNodeRun.objects.filter(run_id=run.pk, node_id="big").update(lease_token="someone-else", attempt=2)
                locked = Run.objects.select_for_update().get(pk=run.pk)
                store.append(locked, [Event("flow.node.started", {"node": "big", "attempt": 2})])
        return real(run, flow, node, row, *args, **kwargs)

    monkeypatch.setattr(nodes, "attempts", restarted_meanwhile)
    run = _run(world, "raced", django_capture_on_commit_callbacks)
    big = FlowNodeRun.objects.get(run=run, node_id="big")
    assert (big.status, big.lease_token) == ("running", "someone-else"), "the other's lease stands"
    assert run.status == "running", "the flow waits for the restarted node"
    assert not RunEvent.objects.filter(run=run, type="flow.node.finished", payload__node="big").exists()
    assert not ToolCallAudit.objects.filter(run_id=run.pk, call_id=call_id(run.pk, "big")).exists(), \
        "the dropped result left no audit row"
    assert not FlowNodeRun.objects.filter(run=run, node_id="done").exists(), "nothing after it started"


def test_a_wave_that_dies_restarts_its_nodes_and_never_reruns_a_committed_one(
    world: World, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_flow(world, {**desk(), "inline": True}, slug="dies")
    real = nodes.attempts

    def dies_at_done(run: Any, flow: Any, node: Any, row: Any, *args: Any, **kwargs: Any) -> Any:
        if node.id == "done":
            raise RuntimeError("the worker died here")
        return real(run, flow, node, row, *args, **kwargs)

    monkeypatch.setattr(nodes, "attempts", dies_at_done)
    run = _run(world, "dies", django_capture_on_commit_callbacks)
    assert run.status == "running"
    rows = {r.node_id: r for r in FlowNodeRun.objects.filter(run=run)}
    assert rows["done"].status == "running" and rows["done"].lease_token, "the dead wave's node keeps its lease"
    assert not ToolCallAudit.objects.filter(run_id=run.pk, call_id=call_id(run.pk, "done")).exists(), \
        "nothing of the dead wave was committed"
    monkeypatch.setattr(nodes, "attempts", real)
    FlowNodeRun.objects.filter(run=run, node_id="done").update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        advance(run.pk)  # what the sweeper does for a run whose node's lease expired
    run.refresh_from_db()
    assert run.terminal_reason == "final_answer", run.error
    attempts = dict(FlowNodeRun.objects.filter(run=run).values_list("node_id", "attempt"))
    assert attempts == {"order": 1, "logistics": 1, "route": 1, "big": 1, "small": 0, "done": 2}
    assert ToolCallAudit.objects.filter(run_id=run.pk, call_id=call_id(run.pk, "big")).count() == 1


#: The meeting point of test_an_inline_waves_tool_calls_run_side_by_side's nodes (a fresh one per test).
MEETING: dict[str, threading.Barrier] = {}

if "test_flow.meet" not in registry:

    @tool(key="test_flow.meet", category="read")
    def meet(who: str) -> dict[str, Any]:
        """Wait until every node of the wave is here (test tool): only calls that run at the same time all meet."""
        MEETING["barrier"].wait(timeout=3)  # BrokenBarrierError: the calls ran one after another
        return {"who": who, "met": True}


def _meeting_flow(world: World, width: int, slug: str, extra: list[dict[str, Any]] | None = None) -> None:
    install_python_tool(tenant=world.tenant, key="test_flow.meet", actor=None)
    wide = [{"id": f"m{i}", "kind": "tool", "tool": "meet", "after": ["start"], "values": {"who": f"m{i}"}}
            for i in range(width)]
    wide += extra or []
    make_flow(world, {"nodes": [lookup("start"), *wide, lookup("join", [n["id"] for n in wide])], "max_parallel": 10,
                      "inline": True, "output": "nodes"}, slug=slug)


def test_an_inline_waves_tool_calls_run_side_by_side(world: World, django_capture_on_commit_callbacks: Any) -> None:
    """Ready nodes run in parallel inline too: the wave's three calls each wait for the other two (run one after
    another, the first waits alone for 3 s and fails the barrier for all)."""
    MEETING["barrier"] = threading.Barrier(3)
    _meeting_flow(world, 3, "meet")
    run = _run(world, "meet", django_capture_on_commit_callbacks)
    assert run.terminal_reason == "final_answer", run.error
    rows = {r.node_id: r for r in FlowNodeRun.objects.filter(run=run)}
    assert {n: (r.status, r.output) for n, r in rows.items() if n.startswith("m")} == {
        f"m{i}": ("done", {"who": f"m{i}", "met": True}) for i in range(3)}
    audit = dict(ToolCallAudit.objects.filter(run_id=run.pk, tool_name="meet").values_list("call_id", "status"))
    assert audit == {call_id(run.pk, f"m{i}"): "ok" for i in range(3)}, "one audit row per call, each ok"
    finished = [e.payload for e in RunEvent.objects.filter(run=run, type="tool.call") if e.payload["tool"] == "meet"]
    assert sorted(p["node"] for p in finished) == ["m0", "m1", "m2"]


def test_a_refused_call_in_a_side_by_side_wave_fails_only_its_node(world: World, django_capture_on_commit_callbacks: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before it runs (here a switched-off tool) or failing as it begins, a node's call fails that node (its
    on_error decides) while the wave's others run together; each call has its audit row."""
    MEETING["barrier"] = threading.Barrier(2)
    off = {"id": "off", "kind": "tool", "tool": "sum_order_totals", "after": ["start"], "values": {"order_ids": [ORDER]},
           "on_error": "continue"}
    broken = {"id": "broken", "kind": "tool", "tool": "query_logistics", "after": ["start"],
              "inputs": {"order_id": "input.order_id"}, "on_error": "continue"}
    _meeting_flow(world, 2, "refused", [off, broken])
    Tool.objects.filter(tenant=world.tenant, name="sum_order_totals").update(enabled=False)

    class FailsToBegin(tool_node.ToolGateway):
        def start(self, call: Any, ctx: Any) -> Any:
            if call.name == "query_logistics":  # the "broken" node's tool
                raise RuntimeError("could not begin")
            return super().start(call, ctx)

    monkeypatch.setattr(tool_node, "ToolGateway", FailsToBegin)
    run = _run(world, "refused", django_capture_on_commit_callbacks)
    assert run.terminal_reason == "final_answer", run.error
    rows = {r.node_id: r for r in FlowNodeRun.objects.filter(run=run)}
    assert rows["m0"].output == {"who": "m0", "met": True} and rows["m1"].output == {"who": "m1", "met": True}
    assert rows["off"].status == "failed" and "switched off" in rows["off"].error
    assert rows["broken"].status == "failed" and rows["broken"].error == "internal error: RuntimeError"
    assert rows["join"].status == "done"
    statuses = dict(ToolCallAudit.objects.filter(run_id=run.pk).values_list("call_id", "status"))
    assert statuses[call_id(run.pk, "off")] == "denied"
    assert call_id(run.pk, "broken") not in statuses, "a call that never began has no audit row"


def test_each_wave_sees_a_kill_switch_flipped_after_the_wave_before(world: World, django_capture_on_commit_callbacks: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The first wave decides its tools' policy from the read that resolved them just before it; every later wave reads
    the policy again, so a tool switched off while the first wave committed is refused in the second."""
    from tenants.scoping import actor_for_user
    from tools.services import set_tool_enabled

    make_flow(world, {"nodes": [lookup("a"), {**lookup("b", ["a"]), "on_error": "continue"}], "inline": True},
              slug="two-waves")
    real_complete = commit.complete
    flipped: list[bool] = []

    def complete_then_switch_off(*args: Any, **kwargs: Any) -> Any:
        if not flipped:  # the first wave's commit: the operator switches the tool off meanwhile
            flipped.append(True)
            set_tool_enabled(tool=Tool.objects.get(tenant=world.tenant, name="query_order"), enabled=False,
                             actor=actor_for_user(world.operator))
        return real_complete(*args, **kwargs)

    monkeypatch.setattr(commit, "complete", complete_then_switch_off)
    run = _run(world, "two-waves", django_capture_on_commit_callbacks)
    rows = {r.node_id: r for r in FlowNodeRun.objects.filter(run=run)}
    assert rows["a"].status == "done"
    assert rows["b"].status == "failed" and "switched off" in rows["b"].error
    assert ToolCallAudit.objects.get(run_id=run.pk, call_id=call_id(run.pk, "b")).status == "denied"


def _releases(queries: Any) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].startswith('UPDATE "agents_run" SET "lease_token"')
            and '"lease_expires_at" = NULL' in q["sql"]]


@pytest.mark.django_db(transaction=True)
def test_a_flow_that_ended_in_its_task_gives_its_lease_back_once_with_its_end() -> None:
    """An inline flow's last wave commits the run's end with its lease given back: ``execute_run`` then has no lease to
    release (it used to send an UPDATE that found nothing). A flow whose nodes run as tasks still releases its lease."""
    world = make_world()
    make_flow(world, {**desk(), "inline": True}, slug="inline-desk")
    run_id = start(world, {"flow": "inline-desk", "input": {"order_id": ORDER}}).json()["id"]
    with CaptureQueriesContext(connection) as queries:
        services.execute_run(run_id)
    run = Run.objects.get(pk=run_id)
    assert run.terminal_reason == "final_answer" and run.lease_token == "" and run.lease_expires_at is None, run.error
    assert _releases(queries) == []
    assert runner._ended.runs is None  # nothing kept once run_flow returned
    make_flow(world, desk(), slug="task-desk")
    run_id = start(world, {"flow": "task-desk", "input": {"order_id": ORDER}}).json()["id"]
    with CaptureQueriesContext(connection) as queries:
        services.execute_run(run_id)
    assert len(_releases(queries)) == 1  # its nodes run as tasks: the run is not over, its lease is given back
    run = Run.objects.get(pk=run_id)
    assert run.status == "running" and run.lease_token == ""
