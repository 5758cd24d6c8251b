"""Durability on the live stack: a worker killed mid-run, the sweeper, a new worker, cancel at a step boundary.

The runs use two slow test tools (tests/support/slow_tools.py, loaded by the stack's processes
through AGENTOPS_EXTRA_TOOL_MODULES) that the deterministic planner chains: fetch (step 1),
confirm (step 2), answer (step 3), each tool call taking TEST_SLOW_TOOL_SECONDS (2 s by default).
Both run modes run every test: no skip.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import tests.support.slow_tools as slow_tools
from agents.models import Agent, AgentVersion, Run, RunEvent, RunMessage
from audit.models import ToolCallAudit
from tests.factories import World, make_world
from tests.support.live_stack import ROOT, LiveStack, make_live_stack, replace_executor
from tools.services import install_python_tool

pytestmark = pytest.mark.integration

#: The stacks' processes load tests.support.slow_tools (conftest: AGENTOPS_EXTRA_TOOL_MODULES); sweep often here.
FAST_SWEEP = {"SWEEP_INTERVAL_SECONDS": "1"}
QUESTION = "fetch the ticket for order O202411280001 and confirm the ticket"


@pytest.fixture(scope="module")
def stack(live_stack: LiveStack) -> Iterator[LiveStack]:
    """The session's stack; in production mode with a Celery beat process (the sweeper) next to its worker."""
    if live_stack.mode == "production" and "beat" not in live_stack.processes:
        log = open(live_stack.logdir / "beat.log", "ab")  # noqa: SIM115 - lives as long as the process
        schedule = str(live_stack.logdir / "celerybeat-schedule")
        live_stack.processes["beat"] = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel=INFO", "-s", schedule],
            cwd=ROOT, env={**live_stack.env, **FAST_SWEEP}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    yield live_stack


@pytest.fixture(scope="module")
def slow_world(stack: LiveStack, django_db_blocker: Any) -> World:
    with django_db_blocker.unblock():
        world = make_world()
        tools = [install_python_tool(tenant=world.tenant, key=k, actor=None) for k in slow_tools.SLOW_TOOL_KEYS]
        agent = Agent.objects.create(tenant=world.tenant, slug="slow-agent", name="Slow agent")
        version = AgentVersion.objects.create(tenant=world.tenant, agent=agent, number=1, model="demo/planner",
                                              tools=[t.name for t in tools], policy={"limits": {"max_recursion": 6}})
        Agent.objects.filter(pk=agent.pk).update(current_version=version)
    return world


def _start(stack: LiveStack, world: World) -> str:
    with stack.client(world.raw_key) as http:
        response = http.post("/api/v1/runs", json={"agent": "slow-agent", "input": QUESTION})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _wait_for_step(run_id: str, step: int, timeout: float = 30) -> Run:
    deadline = time.monotonic() + timeout
    while True:
        run = Run.objects.get(pk=run_id)
        if run.step >= step or run.status == "finished":
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} did not commit step {step} in {timeout}s (at step {run.step}, {run.status})")
        time.sleep(0.05)


def _assert_whole_trace(run_id: str) -> list[RunEvent]:
    events = list(RunEvent.objects.filter(run_id=run_id).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "no gap and no duplicate in seq"
    types = [e.type for e in events]
    assert types.count("run.started") == 1 and types.count("run.finished") == 1
    model_steps = [e.step for e in events if e.type == "model.call"]
    assert model_steps == sorted(set(model_steps)), f"each step ran its model call once: {model_steps}"
    indexes = list(RunMessage.objects.filter(run_id=run_id).order_by("index").values_list("index", flat=True))
    assert indexes == list(range(len(indexes))), "the message log has no gap and no duplicate"
    return events


def test_a_run_whose_worker_is_killed_mid_run_finishes_on_a_new_worker(
    stack: LiveStack, slow_world: World, unblocked_db: None
) -> None:
    """Production: SIGKILL the worker process, start another. Embedded: the worker is a thread of the
    server, so SIGKILL a server (a stack of its own) and start another server on the same database."""
    extra: list[LiveStack] = []
    try:
        victim = stack if stack.mode == "production" else _own_stack(extra)
        # given a run that committed its first step and is inside its second (a 2-second tool call)
        run_id = _start(victim, slow_world)
        before = _wait_for_step(run_id, 1)
        assert before.status == "running" and before.step == 1, "the run must still be mid-run when its worker dies"
        # when the process executing it is SIGKILLed
        victim.kill_executor()
        killed = Run.objects.get(pk=run_id)
        assert killed.status == "running" and killed.lease_token, "the dead worker's lease is left behind"
        # and a new worker starts; the sweeper re-enqueues the run once the lease expired
        successor = replace_executor(victim, extra, FAST_SWEEP)
        body = successor.wait_for_run(slow_world.raw_key, run_id, timeout=90)
    finally:
        for own in extra:
            own.stop()
    # then it finished with the answer, resumed from step 1: fetch ran once, confirm's step ran once
    assert body["terminal_reason"] == "final_answer", body
    assert "TKT-280001" in body["output"], body["output"]
    run = Run.objects.get(pk=run_id)
    # one crash: the dead worker's lease; a second would mean the successor lost its live lease (the logs say why)
    assert (run.step, run.crash_count) == (3, 1), successor.log_lines(run_id, "lease", "execute_run")
    events = _assert_whole_trace(run_id)
    assert [e.step for e in events if e.type == "model.call"] == [1, 2, 3]
    assert [(e.step, e.payload.get("tool")) for e in events if e.type == "tool.call"] == [(1, "slow_fetch"), (2, "slow_confirm")]
    audits = sorted(ToolCallAudit.objects.filter(run_id=run_id).values_list("step", "tool_name"))
    assert audits == [(1, "slow_fetch"), (2, "slow_confirm")], "the committed step's tool was not called again"


def _own_stack(extra: list[LiveStack]) -> LiveStack:
    own = make_live_stack(FAST_SWEEP)
    extra.append(own)
    return own


def test_cancel_through_the_api_stops_the_run_at_the_next_step_boundary(
    stack: LiveStack, slow_world: World, unblocked_db: None
) -> None:
    # given a run inside its second step
    run_id = _start(stack, slow_world)
    assert _wait_for_step(run_id, 1).status == "running"
    # when an operator cancels it through the API
    with stack.client(slow_world.raw_key) as http:
        response = http.post(f"/api/v1/runs/{run_id}/cancel")
    # then the API says it will stop; the step in flight completes; the run ends cancelled without an answer
    assert response.status_code == 202, response.text
    assert response.json()["cancel_requested"] is True and response.json()["status"] == "running"
    body = stack.wait_for_run(slow_world.raw_key, run_id, timeout=30)
    assert body["terminal_reason"] == "cancelled", body
    events = _assert_whole_trace(run_id)
    assert [e.step for e in events if e.type == "model.call"] == [1, 2], "no model call after the cancel"
    assert [e.payload.get("tool") for e in events if e.type == "tool.call"] == ["slow_fetch", "slow_confirm"]
    finished = events[-1]
    assert finished.type == "run.finished" and finished.step == 3
    assert "cancel" in finished.payload["reason"]
