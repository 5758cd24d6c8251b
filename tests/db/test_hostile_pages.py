"""What a sweep of the session pages, the admin and the websockets with hostile values found (2026-12-06), each
pinned: numbers that ``isdigit()`` accepts and ``int()`` refuses, JSON nested past the stack or holding a lone
surrogate, NaN in a replay check, a form's refused tenant, a list filter the database cannot take, an over-long
search. Each answered 500 (a websocket frame: a crashed consumer, in tests/db/test_trace_socket.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from agents import services
from agents.models import AgentVersion
from releases.models import EvaluationSet, ReplayBatch
from tenants.scoping import actor_for_api_key
from tests.db.test_approve_with_edits import _approver, _request
from tests.factories import World, make_user, make_world

pytestmark = pytest.mark.django_db

HUGE = "9" * 5000
NOT_ASCII = "²"
DEEP = "[" * 5000 + "]" * 5000


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def finished_run(world: World) -> Any:
    run = services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="order O202411280001?")
    services.execute_run(str(run.pk))
    return run


@pytest.mark.parametrize("value", [HUGE, NOT_ASCII])
def test_typed_numbers_on_the_console_s_pages_are_refused_or_ignored_never_a_500(world: World, value: str) -> None:
    client = signed_in(world.operator)
    for name in ("agent", "version", "user"):
        assert client.get("/console/runs/", {name: value}).status_code == 200  # a filter it cannot read is not applied
    assert client.get("/console/spend/", {"days": value}).status_code == 200
    for name in ("agent", "version"):
        data = {"agent": str(world.agent.pk), "version": str(world.version.pk), "input": "hello", name: value}
        response = client.post("/console/playground/runs/", data)
        assert response.status_code == 400 and response.json()["field"] == name
    for name in ("versions", "limit"):
        response = client.post("/console/evaluation-sets/", {"name": "n", "agent": str(world.agent.pk), name: value})
        assert response.status_code == 400, response.status_code
    assert not EvaluationSet.objects.filter(tenant=world.tenant).exists()


@pytest.mark.parametrize("field, value", [("candidate", "1e3"), ("candidate", "0x10"), ("candidate", NOT_ASCII),
                                          ("candidate", HUGE), ("concurrency", NOT_ASCII), ("concurrency", HUGE),
                                          ("cost_at_most", "nan"), ("cost_at_most", "inf"), ("steps_at_most", "1e400"),
                                          ("steps_at_most", HUGE)])
def test_a_replay_started_from_the_page_with_a_value_no_number_is_refused_with_a_message(world: World, field: str,
                                                                                        value: str) -> None:
    finished_run(world)
    row = services_evaluation_set(world)
    data = {"candidate": str(world.version.pk), "model_mode": "recorded", field: value}
    response = signed_in(world.operator).post(f"/console/evaluation-sets/{row.pk}/replays/", data)
    assert response.status_code == 302 and response["Location"] == f"/console/evaluation-sets/{row.pk}/"
    assert not ReplayBatch.objects.filter(tenant=world.tenant).exists()


def services_evaluation_set(world: World) -> EvaluationSet:
    from releases import services as releases

    return releases.create_evaluation_set(tenant=world.tenant, actor=actor_for_api_key(world.key), name="set",
                                          agent=world.agent, filters={"limit": 5})


@pytest.mark.parametrize("value", [DEEP, '"\\ud800"', "[1e400]"])
def test_an_approver_s_edit_past_the_bounds_is_taken_as_typed_and_refused_by_the_schema(value: str) -> None:
    world = make_world()
    request = _request(world)
    client = signed_in(_approver(world))
    response = client.post(f"/approvals/{request.pk}/decide", {"decision": "approve", "edit": "1", "arg:amount": value})
    assert response.status_code in (302, 400), response.status_code
    request.refresh_from_db()
    assert request.status == "pending"


@pytest.mark.parametrize("arguments", [DEEP, '{"amount": "\\ud800"}', '{"amount": 1e400}'])
def test_the_admin_s_approve_with_edits_form_refuses_json_past_the_bounds(arguments: str) -> None:
    world = make_world()
    request = _request(world)
    approver = _approver(world)
    approver.is_staff = True
    approver.save(update_fields=["is_staff"])
    response = signed_in(approver).post(f"/admin/approvals/approvalrequest/{request.pk}/approve-with-edits/",
                                        {"arguments": arguments, "arguments_hash": request.arguments_hash})
    assert response.status_code == 400 and "Must be JSON within bounds" in response.content.decode()


@pytest.mark.parametrize("field, value", [("policy", DEEP), ("tools", DEEP), ("tools", '["\\ud800"]')])
def test_the_admin_s_version_preview_refuses_json_past_the_bounds(world: World, field: str, value: str) -> None:
    data = {"tools": "[]", "policy": "{}", "_preview_impact": "1", "_preview_days": "7", field: value}
    response = signed_in(world.operator).post(f"/admin/agents/agentversion/{world.version.pk}/change/", data)
    assert response.status_code == 400 and "Must be JSON within bounds" in response.content.decode()


def test_a_flow_version_added_in_the_admin_with_a_tenant_not_offered_is_a_form_error(world: World) -> None:
    from accounts import services as tenant_services
    from agents.models import Agent, AgentKind
    from tenants.models import Role

    other = make_world()
    owner = make_user(is_staff=True)
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    flow = Agent.objects.create(tenant=world.tenant, slug="desk", name="desk", kind=AgentKind.FLOW)
    data = {"tenant": str(other.tenant.pk), "agent": str(flow.pk), "number": "1", "model": "demo/planner",
            "definition": '{"nodes": [{"id": "a", "kind": "tool", "tool": "query_order", "values": {"order_id": "x"}}]}',
            "tools": "[]", "policy": "{}"}
    response = signed_in(owner).post("/admin/agents/flowversion/add/", data)
    assert response.status_code == 200 and "errorlist" in response.content.decode()
    assert not AgentVersion.objects.filter(agent=flow).exists()


@pytest.mark.parametrize("path", ["agents/agent", "agents/run", "tools/tool", "approvals/approvalrequest"])
def test_an_admin_list_filter_the_database_cannot_take_goes_back_to_the_list_and_a_long_search_is_cut(
        world: World, path: str) -> None:
    client = signed_in(world.operator)
    for key in ("created_at__year", "requested_at__year"):
        response = client.get(f"/admin/{path}/", {key: "99999"})
        assert response.status_code == 302, response.status_code
        assert response["Location"].endswith("?e=1")
    response = client.get(f"/admin/{path}/", {"q": "x" * 100_000})
    assert response.status_code == 200
