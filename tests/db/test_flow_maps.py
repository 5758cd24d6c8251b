"""Issue #15, map nodes: a sub-graph per item, bounded, durable per item, collected in item order."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.utils import timezone

from agents import services
from agents.models import Run
from audit.models import ToolCallAudit
from flows.models import FlowNodeRun
from flows.runner import call_id, execute_node
from tests.db.test_flow_runs import ORDER, in_flight, make_flow, start
from tests.factories import World

pytestmark = pytest.mark.django_db


def mapped(**extra: Any) -> dict[str, Any]:
    """A map over the input's order ids: look each order up, then its logistics; each item's result names its index."""
    body = {"nodes": [
        {"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "item"}},
        {"id": "ship", "kind": "tool", "tool": "query_logistics", "after": ["order"], "inputs": {"order_id": "item"}},
    ], "output": "{index: index, total: nodes.order.total, carrier: nodes.ship.carrier}"}
    return {"nodes": [{"id": "each", "kind": "map", "over": "input.orders", "body": body, **extra}],
            "output": "nodes.each", "max_parallel": 8}


def run_map(world: World, orders: list[str], **extra: Any) -> Run:
    make_flow(world, mapped(**extra))
    run_id = start(world, {"flow": "desk", "input": {"orders": orders}}).json()["id"]
    services.execute_run(run_id)
    return Run.objects.get(pk=run_id)


def items_under_way(run: Run) -> set[str]:
    return {r.node_id.split(".")[0] for r in FlowNodeRun.objects.filter(run=run, status="running", node_id__contains="[")}


def item_nodes_running(run: Run) -> int:
    return FlowNodeRun.objects.filter(run=run, status="running", node_id__contains="[").count()


def finish(run: Run, *, each: Any = None) -> None:
    while wave := [w for w in in_flight(run) if "[" in w[0]]:
        node_id, token = wave[-1]  # the highest running: items finish out of order
        execute_node(str(run.pk), node_id, token)
        if each:
            each()
    run.refresh_from_db()


def test_a_map_over_ten_items_runs_at_most_three_at_once_and_collects_in_order(world: World) -> None:
    run = run_map(world, [ORDER] * 10, max_concurrency=3)
    seen: list[int] = [len(items_under_way(run))]
    finish(run, each=lambda: seen.append(len(items_under_way(run))))
    assert max(seen) == 3 and run.terminal_reason == "final_answer", run.error
    output = json.loads(run.output)
    assert [o["index"] for o in output] == list(range(10))
    assert {(o["total"], o["carrier"]) for o in output} == {("259.00", "SF Express")}
    rows = FlowNodeRun.objects.filter(run=run)
    assert rows.count() == 21 and {r.attempt for r in rows} == {1}
    calls = sorted(ToolCallAudit.objects.filter(run=run).values_list("call_id", flat=True))
    assert calls == sorted(call_id(run.pk, f"each[{i}].{n}") for i in range(10) for n in ("order", "ship"))


def test_the_runs_max_parallel_also_bounds_a_map(world: World) -> None:
    make_flow(world, {**mapped(max_concurrency=8), "max_parallel": 2})
    run_id = start(world, {"flow": "desk", "input": {"orders": [ORDER] * 5}}).json()["id"]
    services.execute_run(run_id)
    run = Run.objects.get(pk=run_id)
    seen = [item_nodes_running(run)]
    finish(run, each=lambda: seen.append(item_nodes_running(run)))
    assert max(seen) == 2 and run.terminal_reason == "final_answer"


def test_a_dead_worker_mid_map_resumes_without_running_a_finished_item_again(world: World) -> None:
    run = run_map(world, [ORDER] * 4, max_concurrency=2)
    for _ in range(2):  # item 0 finishes both its nodes
        (node_id, token), *_ = [w for w in in_flight(run) if "[" in w[0]]
        execute_node(str(run.pk), node_id, token)
    assert FlowNodeRun.objects.filter(run=run, node_id__startswith="each[0].", status="done").count() == 2
    dead, token = next(w for w in in_flight(run) if "[" in w[0])
    FlowNodeRun.objects.filter(run=run, node_id=dead).update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    services.execute_run(str(run.pk))  # the sweeper re-enqueues the run: the dead item node starts again
    assert dict(in_flight(run))[dead] != token
    execute_node(str(run.pk), dead, token)  # the dead worker's late task does nothing
    finish(run)
    assert run.terminal_reason == "final_answer", run.error
    rows = {r.node_id: r.attempt for r in FlowNodeRun.objects.filter(run=run)}
    assert rows[dead] == 2 and rows["each[0].order"] == rows["each[0].ship"] == 1
    assert sum(1 for a in rows.values() if a != 1) == 1
    calls = list(ToolCallAudit.objects.filter(run=run).values_list("call_id", flat=True))
    assert len(calls) == len(set(calls)) == 8  # every item node reached the gateway once


@pytest.mark.parametrize("mode", ["fail", "continue"])
def test_a_failing_item_fails_the_map_or_is_collected_as_an_error(world: World, mode: str) -> None:
    run = run_map(world, [ORDER, "O000000000000", ORDER], max_concurrency=1, on_item_error=mode)
    finish(run)
    if mode == "fail":
        assert run.terminal_reason == "error"
        assert run.error.startswith("node each failed: item 1 failed: node order:") and "O000000000000" in run.error
        assert not FlowNodeRun.objects.filter(run=run, node_id__startswith="each[2].").exists()  # nothing more began
    else:
        assert run.terminal_reason == "final_answer", run.error
        output = json.loads(run.output)
        assert [o.get("index") for o in output] == [0, None, 2]
        assert output[1]["error"].startswith("node order:") and "O000000000000" in output[1]["error"]
        assert not FlowNodeRun.objects.filter(run=run, node_id="each[1].ship").exists()  # its item stopped there


def test_a_failed_map_follows_its_own_on_error(world: World) -> None:
    run = run_map(world, ["O000000000000"], on_error="continue")
    finish(run)
    assert run.terminal_reason == "final_answer" and json.loads(run.output)["error"].startswith("item 0 failed")


def test_a_list_over_the_cap_or_not_a_list_fails_the_node_with_a_clear_error(world: World) -> None:
    run = run_map(world, [ORDER] * 101)
    finish(run)
    assert run.terminal_reason == "error" and "101 items; a map takes at most 100" in run.error
    assert not FlowNodeRun.objects.filter(run=run, node_id__contains="[").exists()
    run_id = start(world, {"flow": "desk", "input": {"orders": "O1"}}).json()["id"]
    services.execute_run(run_id)
    run = Run.objects.get(pk=run_id)
    assert "is not a list (it is str)" in run.error


def test_an_empty_list_maps_to_an_empty_output(world: World) -> None:
    run = run_map(world, [])
    finish(run)
    assert run.terminal_reason == "final_answer" and json.loads(run.output) == []


def test_the_published_schema_documents_map_nodes_and_the_api_refuses_a_bad_map_by_its_path(world: World) -> None:
    from django.test import Client

    from tests.db.test_flow_runs import client_for

    schema = Client().get("/api/schema/", headers={"Accept": "application/json",
                                                   "Authorization": f"Bearer {world.raw_key}"}).json()
    found = [c["properties"]["definition"] for c in schema["components"]["schemas"].values()
             if "definition" in c.get("properties", {}) and "nodes" in str(c["properties"]["definition"])]
    assert found
    for definition in found:
        node = definition["properties"]["nodes"]["items"]["properties"] if "properties" in definition else \
            next(a for a in definition["anyOf"] if "properties" in a)["properties"]["nodes"]["items"]["properties"]
        assert "map" in node["kind"]["enum"] and node["max_concurrency"]["minimum"] == 1
        assert node["on_item_error"]["enum"] == ["fail", "continue"]
        body = next(a for a in node["body"].get("anyOf", [node["body"]]) if "properties" in a)
        assert body["properties"]["nodes"]["items"]["properties"]["kind"]["enum"] == ["tool", "llm", "switch"]
        assert "$ref" not in str(node)
    api = client_for(world.raw_key)
    assert api.post("/api/v1/flows", {"slug": "bad", "name": "bad"}, format="json").status_code == 201
    bad = mapped(max_concurrency=0)
    bad["nodes"][0]["body"]["nodes"][1]["tool"] = "no_such_tool"
    answer = api.post("/api/v1/flows/bad/versions", {"model": "demo/planner", "definition": bad}, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["definition"] == ["nodes[0].max_concurrency: must be an integer from 1 to 32, got 0"]
    del bad["nodes"][0]["max_concurrency"]
    answer = api.post("/api/v1/flows/bad/versions", {"model": "demo/planner", "definition": bad}, format="json")
    assert answer.status_code == 400 and answer.json()["definition"][0].startswith(
        "nodes[0].body.nodes[1].tool: no tool 'no_such_tool'"), answer.content


def test_a_failing_node_beside_a_map_stops_the_map_from_starting_items_and_the_run_ends(world: World) -> None:
    definition = mapped(max_concurrency=1)
    definition["nodes"].append({"id": "bad", "kind": "tool", "tool": "query_order", "values": {"order_id": "O000000000000"}})
    make_flow(world, definition)
    run_id = start(world, {"flow": "desk", "input": {"orders": [ORDER] * 3}}).json()["id"]
    services.execute_run(run_id)
    run = Run.objects.get(pk=run_id)
    bad = dict(in_flight(run))["bad"]
    execute_node(run_id, "bad", bad)  # the flow is failing: item 0's node still runs to its end, nothing more starts
    finish(run)
    assert run.terminal_reason == "error" and run.error.startswith("node bad failed:"), run.error
    assert not FlowNodeRun.objects.filter(run=run, node_id__startswith="each[1].").exists()
    assert FlowNodeRun.objects.get(run=run, node_id="each").status == "failed"


def test_the_tenants_node_bound_also_bounds_a_map(world: World, settings: Any) -> None:
    settings.TENANT_MAX_RUNNING = 2
    run = run_map(world, [ORDER] * 6, max_concurrency=4)
    seen = [item_nodes_running(run)]
    finish(run, each=lambda: seen.append(item_nodes_running(run)))
    assert max(seen) == 2 and run.terminal_reason == "final_answer", run.error
