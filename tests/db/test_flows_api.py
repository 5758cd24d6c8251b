"""Issue #15, definitions: flows and their versions over the API, checked at save, tenant-scoped, audited."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.models import Agent, AgentVersion
from audit.models import ConfigChange
from tests.factories import World, make_world
from tools.models import Tool

pytestmark = pytest.mark.django_db

DESK: dict[str, Any] = {
    "scopes": ["orders:read"],
    "nodes": [
        {"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
        {"id": "logistics", "kind": "tool", "tool": "query_logistics", "inputs": {"order_id": "input.order_id"}},
        {"id": "route", "kind": "switch", "after": ["order", "logistics"],
         "cases": [{"when": "nodes.order.total > `100`", "goto": ["check"]}], "default": ["summary"]},
        {"id": "check", "kind": "approval", "preview": "Order {input.order_id} is over 100: go on?"},
        {"id": "summary", "kind": "llm", "after": ["check"], "prompt": "Summarize {nodes.order} and {nodes.logistics}"},
    ],
    "output": "nodes.summary",
}


def client_for(world: World) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    return client


@pytest.fixture
def world() -> World:
    world = make_world()
    Tool.objects.filter(tenant=world.tenant, name="query_order").update(required_scopes=["orders:read"])
    return world


def test_a_flow_and_its_version_are_created_checked_stored_whole_and_audited(world: World) -> None:
    api = client_for(world)
    created = api.post("/api/v1/flows", {"slug": "desk", "name": "Order desk"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["kind"] == "flow"
    version = api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": DESK, "make_current": True},
                       format="json")
    assert version.status_code == 201, version.content
    stored = version.json()["definition"]
    assert stored["nodes"][0]["timeout_seconds"] == 60 and stored["max_parallel"] == 4  # defaults filled in
    assert AgentVersion.objects.get(agent__slug="desk", tenant=world.tenant).definition == stored
    assert [a["slug"] for a in api.get("/api/v1/flows").json()["results"]] == ["desk"]
    assert "desk" not in [a["slug"] for a in api.get("/api/v1/agents").json()["results"]]
    assert api.get("/api/v1/agents/desk").status_code == 404 and api.get("/api/v1/flows/order-assistant").status_code == 404
    actions = list(ConfigChange.objects.filter(tenant=world.tenant).values_list("action", flat=True))
    assert "flow.created" in actions and "agent_version.created" in actions


def test_a_definition_that_could_not_run_is_refused_with_every_path(world: World) -> None:
    api = client_for(world)
    api.post("/api/v1/flows", {"slug": "desk", "name": "Order desk"}, format="json")
    broken = {**DESK, "scopes": [], "nodes": [*DESK["nodes"][:4], {**DESK["nodes"][4], "tool": "x"}]}
    response = api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": broken}, format="json")
    assert response.status_code == 400
    assert response.json()["definition"] == ["nodes[4].tool: not a field of a llm node; it takes ['prompt', 'output_schema', 'model']"]
    unscoped = {**DESK, "scopes": [], "nodes": [*DESK["nodes"], {"id": "ghost", "kind": "tool", "tool": "teleport"}]}
    response = api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": unscoped}, format="json")
    assert response.status_code == 400
    errors = response.json()["definition"]
    assert any(e.startswith("nodes[0].tool: 'query_order' needs the scopes ['orders:read']") for e in errors), errors
    assert any(e.startswith("nodes[5].tool: no tool 'teleport' for this tenant") for e in errors), errors
    cyclic = {"nodes": [{"id": "a", "kind": "tool", "tool": "query_logistics", "after": ["b"]},
                        {"id": "b", "kind": "tool", "tool": "query_logistics", "after": ["a"]}]}
    response = api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": cyclic}, format="json")
    assert response.status_code == 400 and response.json()["definition"][0].startswith("nodes: a cycle ")
    assert response.json()["error"]["field"] == "definition"
    assert not AgentVersion.objects.filter(agent__slug="desk").exists()


def test_agents_and_flows_do_not_mix(world: World) -> None:
    api = client_for(world)
    response = api.post("/api/v1/agents/order-assistant/versions", {"model": "demo/planner", "definition": DESK}, format="json")
    assert response.status_code == 400
    assert "Only a flow's versions have a definition" in response.json()["definition"][0]
    api.post("/api/v1/flows", {"slug": "desk", "name": "Order desk"}, format="json")
    assert api.post("/api/v1/flows", {"slug": "order-assistant", "name": "clash"}, format="json").json()["slug"] == [
        "The tenant already has an agent 'order-assistant'; choose another slug or add a version to it."]
    response = api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "tools": ["query_order"], "definition": DESK},
                        format="json")
    assert response.status_code == 400 and "leave tools empty" in response.json()["definition"][0]
    response = api.post("/api/v1/runs", {"agent": "desk", "input": "hello"}, format="json")
    assert response.status_code == 400 and "'desk' is a flow" in response.json()["agent"][0]


def test_a_flow_may_call_the_tenants_agents_but_never_another_tenants(world: World) -> None:
    other = make_world()
    api, foreign = client_for(world), client_for(other)
    api.post("/api/v1/flows", {"slug": "desk", "name": "Order desk"}, format="json")
    api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": DESK}, format="json")
    # the other tenant cannot see, change or add to it: 404, as for any foreign object
    assert foreign.get("/api/v1/flows/desk").status_code == 404
    assert foreign.get("/api/v1/flows/desk/versions/1").status_code == 404
    assert foreign.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": DESK},
                        format="json").status_code == 404
    # and a flow names agents and tools of its own tenant only
    Agent.objects.create(tenant=other.tenant, slug="secret-agent", name="x")
    calls_foreign = {"nodes": [{"id": "ask", "kind": "agent", "agent": "secret-agent"}]}
    response = api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": calls_foreign}, format="json")
    assert response.status_code == 400
    assert response.json()["definition"] == ["nodes[0].agent: no agent 'secret-agent' for this tenant; the agents are "
                                              "['order-assistant']"]
    calls_own = {"nodes": [{"id": "ask", "kind": "agent", "agent": "order-assistant", "inputs": {"text": "input.question"}}]}
    response = api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": calls_own}, format="json")
    assert response.status_code == 201, response.content


def test_an_agent_tool_cannot_point_at_a_flow(world: World) -> None:
    api = client_for(world)
    api.post("/api/v1/flows", {"slug": "desk", "name": "Order desk"}, format="json")
    response = api.post("/api/v1/tools", {"name": "ask_desk", "kind": "agent", "description": "the desk",
                                          "config": {"agent": "desk"}}, format="json")
    assert response.status_code == 400
    assert "there is no agent 'desk' in this tenant. Known agents: order-assistant." in str(response.json()["config"])


def test_an_approval_node_no_one_could_decide_is_refused_at_save_naming_the_role(world: World) -> None:
    api = client_for(world)
    api.post("/api/v1/flows", {"slug": "desk", "name": "Order desk"}, format="json")
    for roles, words in ((["viewer"], "a viewer only reads"), (["approvers"], "no such role"), ([], "at least one role")):
        nodes = [*DESK["nodes"][:3], {**DESK["nodes"][3], "approver_roles": roles}, DESK["nodes"][4]]
        response = api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": {**DESK, "nodes": nodes}},
                            format="json")
        assert response.status_code == 400, (roles, response.content)
        [error] = response.json()["definition"]
        assert error.startswith("nodes[3].approver_roles") and words in error and "got" in error, error
    assert not AgentVersion.objects.filter(agent__slug="desk").exists()


def test_the_roles_that_may_decide_and_the_read_only_ones_are_the_tenants_roles() -> None:
    from runtime.approval_policy import APPROVER_ROLES, READ_ONLY_ROLES
    from tenants.models import Role

    assert set(APPROVER_ROLES) | set(READ_ONLY_ROLES) == set(Role.values) and not set(APPROVER_ROLES) & set(READ_ONLY_ROLES)
