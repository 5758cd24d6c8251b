"""Flows on the live stack (issue #15), both run modes: parallel branches as separate node tasks, and a worker killed
mid-branch whose flow finishes with each node completed once.

The nodes call the slow test tools (tests/support/slow_tools.py, 2 s a call), so two branches that overlap in time ran
in parallel.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import tests.support.slow_tools as slow_tools
from agents.models import Run, RunEvent
from audit.models import ToolCallAudit
from flows.models import FlowNodeRun
from flows.runner import call_id
from tests.factories import World, make_world
from tests.support.live_stack import ROOT, LiveStack, make_live_stack, replace_executor
from tools.services import install_python_tool

pytestmark = pytest.mark.integration

ORDER = "O202411280001"
#: Sweep often; a dead node's lease expires 3 s after its timeout (5 s below). A flow run whose node tasks run holds no
#: lease of its own until their first heartbeat (the kills below come before it), so the sweeper takes it for dead once
#: it has been quiet for SWEEP_QUEUED_AFTER_SECONDS: 5 s here instead of a minute of waiting in each kill test.
FAST = {"SWEEP_INTERVAL_SECONDS": "1", "FLOW_NODE_LEASE_GRACE_SECONDS": "3", "SWEEP_QUEUED_AFTER_SECONDS": "5"}


def fetch(node_id: str, after: list[str] | None = None) -> dict[str, Any]:
    return {"id": node_id, "kind": "tool", "tool": "slow_fetch", "inputs": {"order_id": "input.order_id"},
            "after": after or [], "timeout_seconds": 5}


BRANCHES: dict[str, Any] = {
    "nodes": [
        fetch("ticket"),
        {"id": "confirm", "kind": "tool", "tool": "slow_confirm", "after": ["ticket"], "timeout_seconds": 5,
         "inputs": {"ticket": "nodes.ticket.ticket"}},
        fetch("again", ["ticket"]),
        {"id": "order", "kind": "tool", "tool": "query_order", "after": ["ticket"], "inputs": {"order_id": "input.order_id"},
         "timeout_seconds": 5},  # as the others: a kill that catches it running waits 8 s for its lease, not 63 s
        {"id": "summary", "kind": "llm", "after": ["confirm", "again", "order"],
         "prompt": "Ticket {nodes.ticket.ticket} confirmed: {nodes.confirm.confirmed}; total {nodes.order.total}."},
    ],
    "output": "nodes.summary",
}


def _own(extra: list[LiveStack]) -> LiveStack:
    stack = make_live_stack(FAST)
    extra.append(stack)
    if stack.mode == "production":  # the sweeper: a beat process next to the worker
        log = open(stack.logdir / "beat.log", "ab")  # noqa: SIM115 - lives as long as the process
        stack.processes["beat"] = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel=INFO", "-s",
             str(stack.logdir / "celerybeat-schedule")],
            cwd=ROOT, env=stack.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return stack


@pytest.fixture(scope="module")
def stacks(django_db_setup: Any) -> Iterator[list[LiveStack]]:
    extra: list[LiveStack] = []
    try:
        yield extra
    finally:
        for stack in extra:
            stack.stop()


@pytest.fixture(scope="module")
def world(stacks: list[LiveStack], django_db_blocker: Any) -> World:
    with django_db_blocker.unblock():
        world = make_world()
        for key in slow_tools.SLOW_TOOL_KEYS:
            install_python_tool(tenant=world.tenant, key=key, actor=None)
    return world


def _flow(stack: LiveStack, world: World, slug: str, definition: dict[str, Any] | None = None) -> None:
    with stack.client(world.raw_key) as http:
        assert http.post("/api/v1/flows", json={"slug": slug, "name": slug}).status_code == 201
        saved = http.post(f"/api/v1/flows/{slug}/versions",
                          json={"model": "demo/planner", "definition": definition or BRANCHES, "make_current": True})
        assert saved.status_code == 201, saved.text


def _start(stack: LiveStack, world: World, slug: str) -> str:
    with stack.client(world.raw_key) as http:
        response = http.post("/api/v1/runs", json={"flow": slug, "input": {"order_id": ORDER}})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _finished_once(run_id: str) -> dict[str, FlowNodeRun]:
    events = list(RunEvent.objects.filter(run_id=run_id).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "no gap and no duplicate in seq"
    finished = sorted(e.payload["node"] for e in events if e.type == "flow.node.finished")
    assert finished == ["again", "confirm", "order", "summary", "ticket"], "each node's completion committed once"
    assert [e.type for e in events].count("run.finished") == 1
    audits = sorted(ToolCallAudit.objects.filter(run_id=run_id).values_list("call_id", flat=True))
    assert audits == sorted(call_id(run_id, n) for n in ("again", "confirm", "order", "ticket"))
    return {r.node_id: r for r in FlowNodeRun.objects.filter(run_id=run_id)}


def test_a_flow_runs_its_branches_in_parallel_to_the_end(stacks: list[LiveStack], world: World, unblocked_db: None) -> None:
    stack = _own(stacks)
    _flow(stack, world, "branches")
    began = time.monotonic()
    run_id = _start(stack, world, "branches")
    body = stack.wait_for_run(world.raw_key, run_id, timeout=60)
    took = time.monotonic() - began
    assert body["terminal_reason"] == "final_answer", body
    assert "Ticket TKT-280001 confirmed: true; total 259.00." in body["output"]
    nodes = _finished_once(run_id)
    confirm, again = nodes["confirm"], nodes["again"]
    assert confirm.started_at < again.finished_at and again.started_at < confirm.finished_at, "the branches overlapped"
    assert took < 3 * slow_tools.SLOW_SECONDS + 4, f"three slow calls, two of them at once: {took:.1f}s"
    assert {r.attempt for r in nodes.values()} == {1}


def test_a_worker_killed_mid_branch_finishes_the_flow_with_each_node_once(
    stacks: list[LiveStack], world: World, unblocked_db: None
) -> None:
    victim = _own(stacks)
    _flow(victim, world, "killed")
    run_id = _start(victim, world, "killed")
    deadline = time.monotonic() + 30
    # both slow branches are separate tasks: wait until each has begun its 2-second call, then kill. A row says
    # "running" as soon as its task is queued; a task the worker had not taken yet would run as attempt 1 after the
    # kill, so the calls themselves are waited for: ticket's, then the two branches' (three slow calls begun).
    while (FlowNodeRun.objects.filter(run_id=run_id, node_id__in=["confirm", "again"], status="running").count() < 2
           or victim.slow_calls_begun() < 3):
        assert time.monotonic() < deadline, "the branches never started"
        time.sleep(0.05)
    victim.kill_executor()  # production: the worker process; embedded: the server and its worker thread
    assert Run.objects.get(pk=run_id).status == "running"
    assert not FlowNodeRun.objects.filter(run_id=run_id, node_id__in=["confirm", "again"], status="done").exists(), (
        "a branch finished before the kill: the test killed too late to check a restart")
    successor = replace_executor(victim, stacks, FAST)
    body = successor.wait_for_run(world.raw_key, run_id, timeout=90)
    assert body["terminal_reason"] == "final_answer", body
    nodes = _finished_once(run_id)
    assert nodes["ticket"].attempt == 1, "the node committed before the kill did not run again"
    assert nodes["confirm"].attempt == 2 and nodes["again"].attempt == 2, "the killed branches started again"


def test_a_worker_killed_mid_inline_wave_finishes_the_flow_with_each_node_once(
    stacks: list[LiveStack], world: World, unblocked_db: None
) -> None:
    """``inline: true``: the three nodes after ``ticket`` run in one task (their calls side by side); killed in that wave, the
    successor runs the wave again (attempt 2) and never the committed ``ticket``."""
    victim = _own(stacks)
    _flow(victim, world, "killed-inline", {**BRANCHES, "inline": True})
    run_id = _start(victim, world, "killed-inline")
    deadline = time.monotonic() + 30
    # the wave's two slow calls begin side by side (after ticket's): killed inside them
    while not FlowNodeRun.objects.filter(run_id=run_id, node_id="confirm", status="running").exists() \
            or victim.slow_calls_begun() < 3:
        assert time.monotonic() < deadline, "the wave never started"
        time.sleep(0.05)
    victim.kill_executor()
    assert Run.objects.get(pk=run_id).status == "running"
    successor = replace_executor(victim, stacks, FAST)
    body = successor.wait_for_run(world.raw_key, run_id, timeout=90)
    assert body["terminal_reason"] == "final_answer", body
    nodes = _finished_once(run_id)
    assert nodes["ticket"].attempt == 1, "the node committed before the kill did not run again"
    assert {nodes[n].attempt for n in ("confirm", "again", "order")} == {2}, "the killed wave started again"
    finished = RunEvent.objects.filter(run_id=run_id, type="flow.node.finished", payload__node="confirm").get()
    assert finished.payload.get("inline") is True


GATED: dict[str, Any] = {
    "nodes": [
        fetch("ticket"),
        {"id": "check", "kind": "approval", "after": ["ticket"], "inputs": {"ticket": "nodes.ticket.ticket"},
         "preview": "Confirm ticket {nodes.ticket.ticket}?"},
        {"id": "confirm", "kind": "tool", "tool": "slow_confirm", "after": ["check"], "timeout_seconds": 5,
         "inputs": {"ticket": "nodes.ticket.ticket"}},
    ],
    "output": "nodes.confirm",
}


@pytest.mark.parametrize("verb", ["approve", "reject"])
def test_an_approval_node_is_approved_or_rejected_through_the_api(
    stacks: list[LiveStack], world: World, unblocked_db: None, verb: str
) -> None:
    from accounts import services as tenant_services
    from approvals.models import ApprovalRequest
    from tenants.models import Role
    from tests.factories import make_user

    stack = stacks[0] if stacks else _own(stacks)
    slug = f"gated-{verb}"
    with stack.client(world.raw_key) as http:
        assert http.post("/api/v1/flows", json={"slug": slug, "name": slug}).status_code == 201
        assert http.post(f"/api/v1/flows/{slug}/versions", json={"model": "demo/planner", "definition": GATED,
                                                                  "make_current": True}).status_code == 201
    run_id = _start(stack, world, slug)
    body = stack.wait_for_run(world.raw_key, run_id, timeout=30, statuses=("waiting", "finished"))
    assert body["status"] == "waiting", body
    request = ApprovalRequest.objects.get(run_id=run_id)
    assert request.preview["text"] == "Confirm ticket TKT-280001?"
    approver = make_user()
    tenant_services.set_membership(tenant=world.tenant, user=approver, role=Role.APPROVER, actor=None)
    _key, raw = tenant_services.create_api_key(tenant=world.tenant, name="approver", owner=approver, role=Role.APPROVER,
                                               actor=None)
    with stack.client(world.raw_key) as http:  # the run's starter may not decide
        assert http.post(f"/api/v1/approvals/{request.pk}/approve", json={"note": ""}).status_code == 403
    with stack.client(raw) as http:
        decided = http.post(f"/api/v1/approvals/{request.pk}/{verb}", json={"note": "checked"})
    assert decided.status_code == 200, decided.text
    body = stack.wait_for_run(world.raw_key, run_id, timeout=30)
    nodes = {r.node_id: r for r in FlowNodeRun.objects.filter(run_id=run_id)}
    if verb == "approve":
        assert body["terminal_reason"] == "final_answer", body
        assert nodes["check"].status == "done" and nodes["confirm"].status == "done" and '"confirmed": true' in body["output"]
    else:
        assert body["terminal_reason"] == "error" and "rejected by an approver: checked" in body["error"], body
        assert nodes["check"].status == "failed" and "confirm" not in nodes


DENIED: dict[str, Any] = {
    "nodes": [
        {"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"},
         "on_error": "continue"},
        {"id": "typo", "kind": "tool", "tool": "query_logistics", "inputs": {"order_id": "input.bad_id"},
         "on_error": "continue"},
        {"id": "ticket", "kind": "tool", "tool": "slow_fetch", "after": ["order", "typo"],
         "inputs": {"order_id": "input.order_id"}, "timeout_seconds": 5},
    ],
    "output": "nodes.ticket",
}


def test_gateway_denials_inside_a_flow_fail_their_node_and_leave_audit_rows(
    stacks: list[LiveStack], world: World, unblocked_db: None
) -> None:
    from tools.models import Tool
    from tools.services import set_tool_enabled

    stack = stacks[0] if stacks else _own(stacks)
    slug = "denied"
    with stack.client(world.raw_key) as http:
        assert http.post("/api/v1/flows", json={"slug": slug, "name": slug}).status_code == 201
        saved = http.post(f"/api/v1/flows/{slug}/versions",
                          json={"model": "demo/planner", "definition": DENIED, "make_current": True})
        assert saved.status_code == 201, saved.text
    # given the operator pulls query_order's kill switch after the flow was saved
    order_tool = Tool.objects.get(tenant=world.tenant, name="query_order")
    set_tool_enabled(tool=order_tool, enabled=False, actor=None)
    try:
        with stack.client(world.raw_key) as http:  # and the input holds an order number the tool's schema refuses
            response = http.post("/api/v1/runs", json={"flow": slug, "input": {"order_id": ORDER, "bad_id": "12"}})
        assert response.status_code == 202, response.text
        run_id = str(response.json()["id"])
        body = stack.wait_for_run(world.raw_key, run_id, timeout=60)
    finally:
        set_tool_enabled(tool=order_tool, enabled=True, actor=None)
    # then both nodes failed at the gateway (continue: the flow went on), each with its audit row, and no tool ran
    assert body["terminal_reason"] == "final_answer", body
    nodes = {r.node_id: r for r in FlowNodeRun.objects.filter(run_id=run_id)}
    assert nodes["order"].status == "failed" and nodes["typo"].status == "failed", {k: v.status for k, v in nodes.items()}
    assert nodes["ticket"].status == "done"
    audits = {a.call_id: a for a in ToolCallAudit.objects.filter(run_id=run_id)}
    assert audits[call_id(run_id, "order")].status == "denied", audits[call_id(run_id, "order")].status
    assert audits[call_id(run_id, "typo")].status in ("invalid", "denied", "error"), audits[call_id(run_id, "typo")].status
    calls = {e.payload.get("node"): e.payload for e in RunEvent.objects.filter(run_id=run_id, type="flow.node.finished")}
    assert "switched off by an operator" in str(calls["order"]), calls["order"]


MAPPED: dict[str, Any] = {
    "nodes": [{"id": "each", "kind": "map", "over": "input.orders", "max_concurrency": 2, "body": {
        "nodes": [{"id": "fetch", "kind": "tool", "tool": "slow_fetch", "inputs": {"order_id": "item"},
                   "timeout_seconds": 5}],
        "output": "{index: index, ticket: nodes.fetch.ticket}"}}],
    "output": "nodes.each",
}
MAP_ORDERS = [f"O20241128{n:04d}" for n in range(1, 6)]


def test_a_map_runs_two_items_at_a_time_and_a_killed_worker_resumes_it_without_rerunning_an_item(
    stacks: list[LiveStack], world: World, unblocked_db: None
) -> None:
    victim = _own(stacks)
    with victim.client(world.raw_key) as http:
        assert http.post("/api/v1/flows", json={"slug": "mapped", "name": "mapped"}).status_code == 201
        saved = http.post("/api/v1/flows/mapped/versions",
                          json={"model": "demo/planner", "definition": MAPPED, "make_current": True})
        assert saved.status_code == 201, saved.text
        response = http.post("/api/v1/runs", json={"flow": "mapped", "input": {"orders": MAP_ORDERS}})
    assert response.status_code == 202, response.text
    run_id = str(response.json()["id"])
    deadline = time.monotonic() + 40
    while not (FlowNodeRun.objects.filter(run_id=run_id, node_id__contains="[", status="done").exists()
               and FlowNodeRun.objects.filter(run_id=run_id, node_id__contains="[", status="running").exists()):
        assert time.monotonic() < deadline, "the map's items never ran"
        time.sleep(0.05)
    committed = set(FlowNodeRun.objects.filter(run_id=run_id, node_id__contains="[", status="done")
                    .values_list("node_id", flat=True))
    victim.kill_executor()
    successor = replace_executor(victim, stacks, FAST)
    body = successor.wait_for_run(world.raw_key, run_id, timeout=120)
    assert body["terminal_reason"] == "final_answer", body
    assert json.loads(body["output"]) == [{"index": i, "ticket": f"TKT-{o[-6:]}"} for i, o in enumerate(MAP_ORDERS)]
    rows = list(FlowNodeRun.objects.filter(run_id=run_id, node_id__contains="[").order_by("started_at"))
    assert len(rows) == 5 and any(r.attempt == 2 for r in rows), "a killed item node started again"
    assert all(r.attempt == 1 for r in rows if r.node_id in committed), "a committed item never ran again"
    for row in rows:  # never more than two items at once (as each one started)
        at_once = [r.node_id for r in rows if r.started_at <= row.started_at < r.finished_at]
        assert len(at_once) <= 2, at_once
    audits = list(ToolCallAudit.objects.filter(run_id=run_id).values_list("call_id", flat=True))
    assert sorted(set(audits)) == sorted(call_id(run_id, f"each[{i}].fetch") for i in range(5))
