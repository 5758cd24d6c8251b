"""A supervisor's sub-agents are checked when its version is saved, through the API, the admin and the service alike:
each error names the path; another tenant's agent is as unknown as one that does not exist."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.test import APIClient

from agents import services
from agents.models import Agent, AgentKind, AgentVersion
from tenants.scoping import actor_for_user
from tests.factories import World, make_world
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    world = make_world()
    for slug in ("billing", "logistics"):
        Agent.objects.create(tenant=world.tenant, slug=slug, name=slug.title())
    Agent.objects.create(tenant=world.tenant, slug="refund-flow", name="Refund flow", kind=AgentKind.FLOW)
    return world


@pytest.fixture
def api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _supervisor(*slugs: str, **extra: Any) -> dict[str, Any]:
    return {"supervisor": {"sub_agents": [{"agent": s, "description": f"handles {s}"} for s in slugs],
                           "mode": "rules", "fallback": slugs[0], **extra}}


def _post(api: APIClient, policy: dict[str, Any]) -> Any:
    return api.post("/api/v1/agents/order-assistant/versions", {"model": "demo/planner", "policy": policy}, format="json")


def test_a_valid_supervisor_is_saved_normalised(world: World, api: APIClient) -> None:
    response = _post(api, _supervisor("billing", "logistics", rules=[{"agent": "logistics", "intent": ["logistics"]}]))
    assert response.status_code == 201, response.content
    saved = response.json()["policy"]["supervisor"]
    assert saved["rules"] == [{"agent": "logistics", "intent": ["logistics"], "keywords": [], "regex": None}]
    assert saved["mode"] == "rules" and saved["fallback"] == "billing"


def test_another_tenants_agent_is_refused_as_unknown(world: World, api: APIClient) -> None:
    # given a second tenant with an agent "tenant-b-secrets"; when tenant A's supervisor names it
    other = make_world()
    Agent.objects.create(tenant=other.tenant, slug="tenant-b-secrets", name="B")
    response = _post(api, _supervisor("billing", "tenant-b-secrets"))
    # then it is unknown, exactly like a slug that exists nowhere, and nothing is saved
    assert response.status_code == 400
    assert response.json()["policy"] == [
        "policy.supervisor.sub_agents[1].agent: unknown agent 'tenant-b-secrets'; name an agent of this tenant"]
    nowhere = _post(api, _supervisor("billing", "no-such-agent")).json()["policy"]
    assert nowhere == ["policy.supervisor.sub_agents[1].agent: unknown agent 'no-such-agent'; name an agent of this tenant"]
    assert AgentVersion.objects.filter(agent=world.agent).count() == 1
    # and the other tenant, with its own key, cannot name tenant A's agents either
    foreign = APIClient()
    foreign.credentials(HTTP_AUTHORIZATION=f"Bearer {other.raw_key}")
    refused = _post(foreign, _supervisor("billing"))
    assert refused.status_code == 400 and "unknown agent 'billing'" in refused.json()["policy"][0]


def test_a_flow_itself_and_an_unknown_intent_are_refused_by_path(api: APIClient) -> None:
    response = _post(api, _supervisor("billing", "refund-flow", "order-assistant",
                                      rules=[{"agent": "billing", "intent": ["teleport"]}]))
    assert response.status_code == 400
    errors = response.json()["policy"]
    assert "policy.supervisor.sub_agents[1].agent: 'refund-flow' is a flow; only agents can be sub-agents" in errors
    assert "policy.supervisor.sub_agents[2].agent: a supervisor cannot name itself as a sub-agent, got 'order-assistant'" in errors
    assert any(e.startswith("policy.supervisor.rules[0].intent: unknown intent 'teleport'") for e in errors), errors


def test_an_invalid_regex_is_refused_by_path(api: APIClient) -> None:
    response = _post(api, _supervisor("billing", rules=[{"agent": "billing", "regex": "[a-"}]))
    assert response.status_code == 400
    [error] = response.json()["policy"]
    assert error.startswith("supervisor.rules[0].regex: is not a valid regular expression"), error


def test_the_service_and_the_admin_refuse_the_same(world: World) -> None:
    other = make_world()
    Agent.objects.create(tenant=other.tenant, slug="foreign", name="F")
    actor = actor_for_user(world.operator)
    with pytest.raises(ValidationError) as refused:
        services.create_version(actor=actor, agent=world.agent, model="demo/planner", policy=_supervisor("foreign"))
    assert refused.value.message_dict["policy"] == [
        "policy.supervisor.sub_agents[0].agent: unknown agent 'foreign'; name an agent of this tenant"]
    # updating an unused version is checked too
    draft = services.create_version(actor=actor, agent=world.agent, model="demo/planner", policy={})
    with pytest.raises(ValidationError):
        services.update_version(actor=actor, version=draft, policy=_supervisor("refund-flow"))
    client = Client()
    client.force_login(world.operator)
    form = {"tenant": world.tenant.pk, "agent": world.agent.pk, "number": 7, "model": "demo/planner", "system_prompt": "",
            "tools": json.dumps([]), "policy": json.dumps(_supervisor("foreign")), "note": ""}
    page = client.post("/admin/agents/agentversion/add/", form)
    assert page.status_code == 200, "the form is shown again with the error"
    assert "policy.supervisor.sub_agents[0].agent: unknown agent" in page.content.decode().replace("&#x27;", "'")
    assert not AgentVersion.objects.filter(agent=world.agent, number=7).exists()
    form["policy"] = json.dumps(_supervisor("billing", "logistics"))
    assert client.post("/admin/agents/agentversion/add/", form).status_code == 302
    assert AgentVersion.objects.get(agent=world.agent, number=7).policy["supervisor"]["fallback"] == "billing"
