"""Issue #15, execution: a flow run is a run; its nodes' rows are committed one by one and never run twice."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents import services
from agents.models import Agent, AgentKind, Run, RunEvent, RunStatus
from audit.models import ToolCallAudit
from flows.models import FlowNodeRun
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db

ORDER = "O202411280001"  # total 259.00, shipped


def desk(threshold: int = 100) -> dict[str, Any]:
    return {
        "nodes": [
            {"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
            {"id": "logistics", "kind": "tool", "tool": "query_logistics", "inputs": {"order_id": "input.order_id"}},
            {"id": "route", "kind": "switch", "after": ["order", "logistics"],
             "cases": [{"when": f"to_number(nodes.order.total) > `{threshold}`", "goto": ["big"]}], "default": ["small"]},
            {"id": "big", "kind": "tool", "tool": "sum_order_totals", "values": {"order_ids": [ORDER]}},
            {"id": "small", "kind": "tool", "tool": "sum_order_totals", "values": {"order_ids": [ORDER, ORDER]}},
            {"id": "done", "kind": "tool", "tool": "query_logistics", "after": ["big", "small"],
             "inputs": {"order_id": "input.order_id"}},
        ],
        "output": "{carrier: nodes.logistics.carrier, big: nodes.big.total, small: nodes.small.total}",
    }


def make_flow(world: World, definition: dict[str, Any], slug: str = "desk") -> Agent:
    """Through the API, so the definition is checked as at save (a flow that saved is a flow that can run)."""
    api = client_for(world.raw_key)
    assert api.post("/api/v1/flows", {"slug": slug, "name": slug}, format="json").status_code == 201
    saved = api.post(f"/api/v1/flows/{slug}/versions", {"model": "demo/planner", "definition": definition,
                                                         "make_current": True}, format="json")
    assert saved.status_code == 201, saved.content
    return Agent.objects.get(tenant=world.tenant, slug=slug)


def client_for(raw_key: str) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.fixture
def world() -> World:
    return make_world()


def start(world: World, body: dict[str, Any], **headers: str) -> Any:
    return client_for(world.raw_key).post("/api/v1/runs", body, format="json", **headers)


def test_a_flow_run_is_accepted_as_a_run_and_runs_to_the_end(world: World) -> None:
    make_flow(world, desk())
    answer = start(world, {"flow": "desk", "input": {"order_id": ORDER}})
    assert answer.status_code == 202, answer.content
    run = Run.objects.get(pk=answer.json()["id"])
    assert run.agent.kind == AgentKind.FLOW and run.status == RunStatus.QUEUED
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.FINISHED and run.terminal_reason == "final_answer", run.error
    assert json.loads(run.output) == {"carrier": "SF Express", "big": "259.00", "small": None}
    nodes = {n.node_id: n for n in FlowNodeRun.objects.filter(run=run)}
    assert {k: v.status for k, v in nodes.items()} == {
        "order": "done", "logistics": "done", "route": "done", "big": "done", "small": "skipped", "done": "done"}
    assert nodes["route"].chosen == ["big"] and nodes["order"].attempt == 1
    types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert types.count("flow.node.started") == 5 and types.count("flow.node.finished") == 5 and types[-1] == "run.finished"
    # the tool nodes went through the gateway: one audit row each, with the deterministic call id
    calls = ToolCallAudit.objects.filter(run=run).values_list("call_id", flat=True)
    assert sorted(calls) == sorted(f"flow:{run.pk}:{n}" for n in ("order", "logistics", "big", "done"))


def test_the_flow_input_must_be_an_object_and_the_flow_must_exist(world: World) -> None:
    make_flow(world, desk())
    bad = start(world, {"flow": "desk", "input": "hello"})
    assert bad.status_code == 400 and "Must be a JSON object" in bad.json()["input"][0]
    missing = start(world, {"flow": "nope", "input": {}})
    assert missing.status_code == 400 and "desk" in json.dumps(missing.json())
    agent_as_flow = start(world, {"flow": "order-assistant", "input": {}})
    assert agent_as_flow.status_code == 400 and "No flow 'order-assistant'" in agent_as_flow.json()["flow"][0]
    assert Run.objects.filter(tenant=world.tenant).count() == 0


def test_an_idempotency_key_replays_the_flow_run(world: World) -> None:
    make_flow(world, desk())
    first = start(world, {"flow": "desk", "input": {"order_id": ORDER}}, HTTP_IDEMPOTENCY_KEY="k-1")
    again = start(world, {"flow": "desk", "input": {"order_id": ORDER}}, HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    other = start(world, {"flow": "desk", "input": {"order_id": "O202411280002"}}, HTTP_IDEMPOTENCY_KEY="k-1")
    assert other.status_code == 422


def test_another_tenants_key_cannot_start_or_see_the_flow_run(world: World) -> None:
    make_flow(world, desk())
    run_id = start(world, {"flow": "desk", "input": {"order_id": ORDER}}).json()["id"]
    other = make_world()
    assert start(other, {"flow": "desk", "input": {"order_id": ORDER}}).status_code == 400  # no flow "desk" there
    api = client_for(other.raw_key)
    assert api.get(f"/api/v1/runs/{run_id}").status_code == 404
    assert api.get(f"/api/v1/runs/{run_id}/events").status_code == 404
    assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 404
