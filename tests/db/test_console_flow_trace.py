"""Issue #15 item 6: a flow run's trace page draws its graph coloured by node state and its nodes in parallel lanes."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.utils import timezone

from agents.models import Run, RunEvent
from console.flow_view import NodeSpan, lanes
from flows.models import FlowNodeRun
from tests.db.test_flow_runs import ORDER, make_flow, start
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db

DIAMOND = {"nodes": [
    {"id": "top", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
    {"id": "left", "kind": "tool", "tool": "query_logistics", "after": ["top"], "inputs": {"order_id": "input.order_id"}},
    {"id": "right", "kind": "tool", "tool": "query_order", "after": ["top"], "inputs": {"order_id": "input.order_id"}},
    {"id": "bottom", "kind": "tool", "tool": "query_logistics", "after": ["left", "right"],
     "inputs": {"order_id": "input.order_id"}},
]}


def _login(client: Any, world: World) -> None:
    assert client.login(username=world.operator.username, password="correct-horse-battery")


def _diamond_run(world: World) -> Run:
    make_flow(world, DIAMOND, slug="diamond")
    answer = start(world, {"flow": "diamond", "input": {"order_id": ORDER}})
    assert answer.status_code == 202, answer.content
    run = Run.objects.get(pk=answer.json()["id"])
    t0 = timezone.now() - dt.timedelta(seconds=10)
    at = lambda s: t0 + dt.timedelta(seconds=s)  # noqa: E731
    for node_id, status, began, ended in [("top", "done", 0, 1), ("left", "done", 1, 4), ("right", "running", 1.5, None)]:
        FlowNodeRun.objects.create(tenant_id=run.tenant_id, run=run, node_id=node_id, kind="tool", status=status,
                                   span_id=f"span{node_id}", started_at=at(began), finished_at=ended and at(ended))
    return run


def _spans(page: str) -> dict[str, tuple[str, str]]:
    """node id -> (state, lane) of the lanes' spans."""
    found = re.findall(r'<a class="flow-span" href="#span-(\w+)" data-node="([^"]*)" data-state="(\w+)" data-lane="(\d+)"',
                       page)
    return {node: (state, lane) for _, node, state, lane in found}


def test_the_graph_is_coloured_by_the_node_rows_and_the_diamonds_middle_nodes_take_two_lanes(client: Any) -> None:
    world = make_world()
    run = _diamond_run(world)
    _login(client, world)
    page = client.get(f"/console/runs/{run.pk}/").content.decode()
    graph = dict(re.findall(r'<g class="flow-node" data-node="(\w+)" data-state="(\w+)"', page))
    assert graph == {"top": "succeeded", "left": "succeeded", "right": "running", "bottom": "pending"}
    assert _spans(page) == {"top": ("succeeded", "0"), "left": ("succeeded", "0"), "right": ("running", "1")}
    assert 'href="#span-spanright"' in page  # a span links to the node's events in the trace below
    assert "left · tool · 3.00 s · succeeded" in page and "right · tool · running · running" in page
    assert 'id="flow-spans"' in page and 'id="flow-states"' in page  # trace.js starts from the same state


def test_the_lane_rule_reuses_a_lane_only_once_its_node_ended() -> None:
    t0 = timezone.now()
    at = lambda s: t0 + dt.timedelta(seconds=s)  # noqa: E731
    spans = [NodeSpan("a", "tool", "succeeded", "", at(0), at(1)), NodeSpan("b", "tool", "succeeded", "", at(1), at(5)),
             NodeSpan("c", "tool", "succeeded", "", at(2), at(3)), NodeSpan("d", "tool", "running", "", at(3), None),
             NodeSpan("e", "tool", "running", "", at(4), None)]
    assert {s.node_id: s.lane for s in lanes(spans)} == {"a": 0, "b": 0, "c": 1, "d": 1, "e": 2}


def test_a_plain_agent_run_has_no_flow_section(client: Any) -> None:
    from tests.e2e.builders import make_run

    world = make_world()
    run = make_run(world)
    _login(client, world)
    page = client.get(f"/console/runs/{run.pk}/").content.decode()
    assert page.count('id="flow"') == 0 and "flow-lanes" not in page


def test_a_foreign_tenants_flow_run_is_a_404(client: Any) -> None:
    mine, theirs = make_world(), make_world()
    run = _diamond_run(theirs)
    _login(client, mine)
    assert client.get(f"/console/runs/{run.pk}/").status_code == 404
    _login(client, theirs)
    assert client.get(f"/console/runs/{run.pk}/").status_code == 200


def test_node_ids_kinds_and_outputs_are_escaped(client: Any) -> None:
    world = make_world()
    run = _diamond_run(world)
    evil = "<script>alert(1)</script>"
    FlowNodeRun.objects.filter(run=run, node_id="right").update(node_id=evil, kind='"><img src=x>',  # within the column's 16 characters
                                                                 output={"text": evil})
    seq = 1 + (RunEvent.objects.filter(run=run).order_by("-seq").values_list("seq", flat=True).first() or 0)
    RunEvent.objects.create(tenant_id=run.tenant_id, run=run, seq=seq, step=0, at=timezone.now(), type="flow.node.finished",
                            span_id="", parent_span_id="spanright",
                            payload={"node": evil, "kind": "tool", "status": "done", "output": {"text": evil}})
    _login(client, world)
    page = client.get(f"/console/runs/{run.pk}/").content.decode()
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the lanes show it, as text
    assert "\\u003Cscript\\u003Ealert(1)" in page  # the backlog and the lanes' data, as JSON that is no markup


def test_waiting_failed_and_skipped_rows_colour_their_nodes(client: Any) -> None:
    world = make_world()
    run = _diamond_run(world)
    FlowNodeRun.objects.filter(run=run, node_id="right").update(status="waiting")
    FlowNodeRun.objects.filter(run=run, node_id="left").update(status="failed")
    FlowNodeRun.objects.create(tenant_id=run.tenant_id, run=run, node_id="bottom", kind="tool", status="skipped")
    _login(client, world)
    page = client.get(f"/console/runs/{run.pk}/").content.decode()
    graph = dict(re.findall(r'<g class="flow-node" data-node="(\w+)" data-state="(\w+)"', page))
    assert graph == {"top": "succeeded", "left": "failed", "right": "waiting", "bottom": "skipped"}
    assert set(_spans(page)) == {"top", "left", "right"}, "a skipped node never started: no span"
