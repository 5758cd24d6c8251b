"""A flow's input_schema over the API: a run whose input does not match is refused before anything is stored (400
naming each field), the schema is checked at save, and the demo's refund desk declares its input."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from agents.models import Agent, AgentVersion, Run, Session
from tests.db.test_flows_api import DESK, client_for
from tests.factories import World, make_world
from tools.models import Tool

pytestmark = pytest.mark.django_db

SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["order_id"], "additionalProperties": False,
    "properties": {"order_id": {"type": "string", "pattern": "^O\\d{12}$", "description": "the order number"}},
}


@pytest.fixture
def world() -> World:
    world = make_world()
    Tool.objects.filter(tenant=world.tenant, name="query_order").update(required_scopes=["orders:read"])
    return world


def _desk(api: APIClient, schema: Any = SCHEMA) -> Any:
    api.post("/api/v1/flows", {"slug": "desk", "name": "Order desk"}, format="json")
    return api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": {**DESK, "input_schema": schema},
                                                    "make_current": True}, format="json")


def test_an_input_that_does_not_match_is_refused_naming_each_field_and_nothing_is_stored(world: World) -> None:
    api = client_for(world)
    assert _desk(api).status_code == 201
    runs, sessions = Run.objects.count(), Session.objects.count()
    for body, expected in [
        ({}, ["input.order_id: required (the order number)"]),
        ({"order_id": 12}, ["input.order_id: expected string, got an integer 12"]),
        ({"order_id": "O1", "x": 1}, ["input.order_id: 'O1' does not match", "input: unknown key(s) 'x'"]),
    ]:
        answer = api.post("/api/v1/runs", {"flow": "desk", "input": body}, format="json")
        assert answer.status_code == 400, answer.content
        message = answer.json()["input"][0]
        assert message.startswith("The input does not match the flow 'desk' (version 1): "), message
        assert all(part in message for part in expected), message
        assert answer.json()["error"]["field"] == "input"
    assert (Run.objects.count(), Session.objects.count()) == (runs, sessions)
    accepted = api.post("/api/v1/runs", {"flow": "desk", "input": {"order_id": "O202411280001"}}, format="json")
    assert accepted.status_code == 202, accepted.content


def test_an_input_schema_whose_pattern_backtracks_refuses_the_input_instead_of_holding_the_server(world: World) -> None:
    """A tenant's pattern such as (a|aa)+$ would hold the API's thread for minutes under Python's re; the check stops
    at its time bound and the run is refused with the pattern named (runtime/patterns.py)."""
    api = client_for(world)
    slow = {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "(a|aa)+$"}}}
    assert _desk(api, schema=slow).status_code == 201
    runs = Run.objects.count()
    answer = api.post("/api/v1/runs", {"flow": "desk", "input": {"order_id": "a" * 34 + "!"}}, format="json")
    assert answer.status_code == 400, answer.content
    message = answer.json()["input"][0]
    assert "could not be checked against the flow's input_schema" in message and "(a|aa)+$" in message, message
    assert Run.objects.count() == runs
    assert api.post("/api/v1/runs", {"flow": "desk", "input": {"order_id": "aaaa"}}, format="json").status_code == 202


def test_an_input_too_slow_for_its_schema_is_refused_within_the_budget(world: World) -> None:
    """No pattern, but anyOf branches that each descend through a $ref: unbounded, a nested list of depth 16 takes
    seconds (depth 20, half an hour); the check stops at its budget and says why."""
    from tests.unit.runtime.test_patterns import BRANCHY, NESTED

    api = client_for(world)
    schema = {"type": "object", "properties": {"order_id": {"type": "string"}, "items": {"$ref": "#/$defs/n"}},
              "$defs": BRANCHY["$defs"]}
    saved = _desk(api, schema=schema)
    assert saved.status_code == 201, saved.content
    answer = api.post("/api/v1/runs", {"flow": "desk", "input": {"order_id": "O1", "items": NESTED}}, format="json")
    assert answer.status_code == 400, answer.content
    assert "took longer than its 250 ms" in answer.json()["input"][0]


def test_a_flow_without_a_schema_takes_any_object(world: World) -> None:
    api = client_for(world)
    assert _desk(api, schema=None).status_code == 201
    assert api.post("/api/v1/runs", {"flow": "desk", "input": {"anything": [1, 2]}}, format="json").status_code == 202


def test_a_schema_that_cannot_check_an_input_is_refused_at_save(world: World) -> None:
    api = client_for(world)
    answer = _desk(api, schema={"type": "object", "properties": {"order_id": {"type": "strng"}}})
    assert answer.status_code == 400
    assert answer.json()["definition"][0].startswith("input_schema.properties.order_id.type: not a valid JSON Schema")
    narrow = {"type": "object", "additionalProperties": False, "properties": {"id": {"type": "string"}}}
    answer = api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": {**DESK, "input_schema": narrow}},
                      format="json")
    assert answer.status_code == 400
    assert answer.json()["definition"][0].startswith("nodes[0].inputs.order_id: reads input.order_id, which the flow's "
                                                     "input_schema does not allow")
    assert not AgentVersion.objects.filter(agent__slug="desk").exists()


def test_agent_and_flow_together_are_refused(world: World) -> None:
    api = client_for(world)
    _desk(api)
    answer = api.post("/api/v1/runs", {"flow": "desk", "agent": "order-assistant", "input": {"order_id": "O202411280001"}},
                      format="json")
    assert answer.status_code == 400 and "not both" in answer.json()["flow"][0]
    assert not Run.objects.exists()


def test_another_tenants_flow_is_unknown_whatever_its_schema(world: World) -> None:
    api = client_for(world)
    _desk(api)
    other = client_for(make_world())
    answer = other.post("/api/v1/runs", {"flow": "desk", "input": {}}, format="json")
    assert answer.status_code == 400 and answer.json()["flow"][0].startswith("No flow 'desk' in tenant")
    assert "order_id" not in answer.content.decode()  # nothing of the other tenant's schema leaks


def test_the_demo_refund_desk_declares_its_input(settings: Any, tmp_path: Any) -> None:
    settings.DEMO_API_KEY, settings.DEMO_PASSWORD, settings.VAR_DIR = "aok_0123abcd_flow-input-test-key", "pw-flow-input", tmp_path
    call_command("seed_demo")
    api = APIClient(raise_request_exception=False)
    api.credentials(HTTP_AUTHORIZATION="Bearer aok_0123abcd_flow-input-test-key")
    answer = api.post("/api/v1/runs", {"flow": "refund-desk", "input": {"order_id": "O202411280001", "amount": "30.00"}},
                      format="json")
    assert answer.status_code == 400 and "input.reason: required" in answer.json()["input"][0], answer.content
    flow = Agent.objects.get(slug="refund-desk")
    assert flow.current_version is not None and flow.current_version.definition["input_schema"]["required"] == [
        "order_id", "amount", "reason"]
    ok = api.post("/api/v1/runs", {"flow": "refund-desk", "input": {"order_id": "O202411280001", "amount": "30.00",
                                                                     "reason": "damaged cup"}}, format="json")
    assert ok.status_code == 202, ok.content


def test_a_flows_current_version_lists_its_tools_and_its_input_schema(world: World) -> None:
    api = client_for(world)
    _desk(api)
    current = api.get("/api/v1/flows/desk").json()["current_version"]
    assert current == {"number": 1, "model": "demo/planner", "tools": ["query_logistics", "query_order"],
                       "input_schema": SCHEMA}
    agent = api.get("/api/v1/agents/order-assistant").json()["current_version"]
    assert "input_schema" not in agent and agent["tools"] == world.version.tools
