"""Issue #49: a flow's expressions are bounded in the work they do, not only in what they make. The issue's
``when`` builds two trees that share their branches and compares them: 2 ** k pairs that Python's ``==`` walked in C
with the GIL held (k = 29: 15 s of a worker and of the embedded server's /healthz; k = 58: centuries). An expression
whose shape alone takes it past the bound is refused at save naming its path; one that gets there through its data
fails its node naming it (runtime/expressions.py, MAX_WORK), and the run ends."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agents import services
from agents.models import Run
from flows.models import FlowNodeRun
from tests.db.test_flow_runs import client_for, drain, make_flow, start
from tests.factories import World

pytestmark = pytest.mark.django_db


def doubling(k: int) -> str:
    return "[input.a, input.b]" + " | [[@[0],@[0]],[@[1],@[1]]]" * k + " | @[0] == @[1]"


def switch_on(when: str) -> dict[str, Any]:
    return {"nodes": [
        {"id": "route", "kind": "switch", "cases": [{"when": when, "goto": ["same"]}], "default": ["different"]},
        {"id": "same", "kind": "tool", "tool": "query_logistics", "values": {"order_id": "O202411280001"}},
        {"id": "different", "kind": "tool", "tool": "query_logistics", "values": {"order_id": "O202411280001"}},
    ]}


def test_a_condition_whose_work_doubles_at_every_step_is_refused_at_save_naming_its_path(world: World) -> None:
    api = client_for(world.raw_key)
    assert api.post("/api/v1/flows", {"slug": "bomb", "name": "bomb"}, format="json").status_code == 201
    saved = api.post("/api/v1/flows/bomb/versions", {"model": "demo/planner", "definition": switch_on(doubling(58))},
                     format="json")
    assert saved.status_code == 400, saved.content[:300]
    said = saved.content.decode()
    assert "nodes[0].cases[0].when: takes up to 2^" in said and "more than the 250000 an evaluation may take" in said
    assert "[[@[0],@[0]],[@[1],@[1]]]" in said


def test_a_condition_whose_data_takes_it_past_the_work_bound_fails_its_node_naming_it(world: World) -> None:
    """Twelve doublings save (4,096 times the data's size); over two lists of 600 numbers they compare 2.5 million
    pairs: the switch fails naming its expression, neither branch runs, the run ends with the node's reason."""
    when = doubling(12)
    make_flow(world, switch_on(when), slug="desk")
    numbers = list(range(600))
    run_id = start(world, {"flow": "desk", "input": {"a": numbers, "b": numbers}}).json()["id"]
    began = time.perf_counter()
    services.execute_run(run_id)
    run = Run.objects.get(pk=run_id)
    drain(run)
    assert time.perf_counter() - began < 5
    assert run.terminal_reason == "error" and run.error.startswith("node route failed:"), run.error
    assert "takes more than the 250000 steps of work its node's expressions share" in run.error and when[:60] in run.error, run.error
    rows = {r.node_id: r.status for r in FlowNodeRun.objects.filter(run=run)}
    assert rows["route"] == "failed" and rows.get("same") in (None, "skipped") and rows.get("different") in (None, "skipped")
