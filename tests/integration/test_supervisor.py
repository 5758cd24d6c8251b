"""Supervisor agents live: a request is routed by rules (no model call) or by the model's choice (the deterministic
planner in embedded mode and against the stack alike) to a sub-agent that answers as a child run; the parent's trace
says where and why, and the API links the child to its parent."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent, AgentVersion
from tests.factories import World, make_world

pytestmark = pytest.mark.integration

SUB_AGENTS = [
    {"agent": "order-assistant", "description": "Order status, shipping, logistics and parcel tracking"},
    {"agent": "totals", "description": "Adds up the sum of several orders: combined totals"},
]


def _agent(world: World, slug: str, policy: dict[str, Any], tools: list[str]) -> None:
    agent = Agent.objects.create(tenant=world.tenant, slug=slug, name=slug)
    version = AgentVersion(tenant=world.tenant, agent=agent, number=1, model="demo/planner", system_prompt="", tools=tools,
                           policy=policy)
    version.full_clean()  # the save-time checks the API and the admin run
    version.save()
    agent.current_version = version
    agent.save(update_fields=["current_version"])


@pytest.fixture(scope="module")
def world(live_stack: Any, django_db_blocker: Any) -> World:
    with django_db_blocker.unblock():
        world = make_world()
        _agent(world, "totals", {}, list(world.version.tools))
        rules = {"mode": "rules", "sub_agents": SUB_AGENTS, "fallback": "order-assistant",
                 "rules": [{"agent": "totals", "keywords": ["total", "sum"]},
                           {"agent": "order-assistant", "regex": r"\bO\d{12}\b"}]}
        _agent(world, "desk-rules", {"supervisor": rules}, [])
        _agent(world, "desk-llm", {"supervisor": {"mode": "llm", "sub_agents": SUB_AGENTS, "fallback": "order-assistant"}}, [])
        return world


def _routed(live_stack: Any, world: World, agent: str, text: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Start a run of ``agent``; return the parent as finished, its route event, and its child run."""
    with live_stack.client(world.raw_key) as http:
        started = http.post("/api/v1/runs", json={"agent": agent, "input": text})
        assert started.status_code == 202, started.text
        parent = live_stack.wait_for_run(world.raw_key, started.json()["id"])
        events = http.get(f"/api/v1/runs/{parent['id']}/events").json()["events"]
        [route] = [e for e in events if e["type"] == "supervisor.route"]
        children = http.get("/api/v1/runs", params={"parent_run": parent["id"]}).json()
        children = children["results"] if isinstance(children, dict) else children
        assert len(children) == 1, children
        [finished] = [e for e in events if e["type"] == "supervisor.child_finished"]
        calls = [e for e in events if e["type"] == "model.call"]
        assert len(calls) == (1 if agent == "desk-llm" else 0), "one routing call in llm mode, none for rules"
        assert all(c["payload"]["task"] == "route" and c["seq"] < route["seq"] for c in calls)
        assert finished["payload"]["child_run"] == children[0]["id"]
        assert route["seq"] < finished["seq"], "the route is in the trace before the child ran"
        child = http.get(f"/api/v1/runs/{children[0]['id']}").json()
    assert [e["type"] for e in events][-1] == "run.finished"
    assert child["parent_run"] == parent["id"] and parent["parent_run"] is None
    return parent, route, child


def test_rules_route_without_a_model_call_and_the_child_answers(live_stack: Any, world: World) -> None:
    parent, route, child = _routed(live_stack, world, "desk-rules", "where is order O202411280001?")
    assert route["payload"] == {"mode": "rules", "agent": "order-assistant", "reason": "rule", "rule": 1,
                                "regex": r"\bO\d{12}\b", "matched": "O202411280001"}
    assert child["agent"] == "order-assistant" and child["terminal_reason"] == "final_answer"
    assert parent["terminal_reason"] == "final_answer" and parent["output"] == child["output"]
    assert "SF" in parent["output"], parent["output"]
    assert parent["usage"] in ({}, None) or not parent["usage"].get("input_tokens"), "rules make no model call"

    parent, route, child = _routed(live_stack, world, "desk-rules", "what is the sum of O202411280001 and O202411280002?")
    assert (route["payload"]["agent"], route["payload"]["keyword"]) == ("totals", "sum")
    assert child["agent"] == "totals"

    parent, route, child = _routed(live_stack, world, "desk-rules", "hello there")
    assert (route["payload"]["agent"], route["payload"]["reason"]) == ("order-assistant", "fallback")
    assert route["payload"]["why"] == "no rule matched"


def test_the_model_picks_the_sub_agent_from_their_descriptions(live_stack: Any, world: World) -> None:
    parent, route, child = _routed(live_stack, world, "desk-llm", "what is the combined total of orders O202411280001 "
                                                                  "and O202411280002?")
    assert route["payload"]["reason"] == "model" and route["payload"]["choice"] == "route_to_totals"
    assert child["agent"] == "totals" and parent["terminal_reason"] == "final_answer"
    assert parent["usage"]["input_tokens"] > 0, "the routing call is counted on the parent"
    assert route["payload"]["agent"] == "totals"

    parent, route, child = _routed(live_stack, world, "desk-llm", "where is my parcel for order O202411280001?")
    assert (route["payload"]["agent"], route["payload"]["reason"]) == ("order-assistant", "model")
    assert child["agent"] == "order-assistant" and parent["output"] == child["output"]
