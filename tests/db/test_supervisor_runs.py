"""Supervisor runs executed as a worker would: one child per run even when a worker dies after routing, and a
sub-agent that is itself a supervisor routes too."""

from __future__ import annotations

from typing import Any

import pytest

from agents import services
from agents.models import Agent, AgentVersion, Run, RunEvent, RunStatus
from agents.supervisor import _append
from runtime.types import Event
from tenants.scoping import actor_for_api_key
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db

ORDER = {"agent": "order-assistant", "description": "Order status and logistics"}


def _agent(world: World, slug: str, supervisor: dict[str, Any]) -> Agent:
    agent = Agent.objects.create(tenant=world.tenant, slug=slug, name=slug)
    version = AgentVersion(tenant=world.tenant, agent=agent, number=1, model="demo/planner", tools=[],
                           policy={"supervisor": supervisor})
    version.full_clean()
    version.save()
    agent.current_version = version
    agent.save(update_fields=["current_version"])
    return agent


def _children(run: Run) -> list[Run]:
    return list(Run.objects.filter(tenant_id=run.tenant_id, facts__parent_run=str(run.pk)))


def test_a_worker_that_died_after_routing_and_starting_the_child_does_not_route_or_start_it_again(world: World) -> None:
    # given a supervisor run whose worker committed its route, created the child run and died (the child never ran)
    desk = _agent(world, "desk", {"sub_agents": [ORDER], "fallback": "order-assistant"})
    actor = actor_for_api_key(world.key)
    run = services.start_run(actor=actor, agent=desk, text="where is order O202411280001?")
    root = Event("run.started", {"supervisor": "rules"})
    _append(run, [root, Event("supervisor.route", {"mode": "rules", "agent": "order-assistant", "reason": "fallback"},
                              parent_span_id=root.span_id)], step=1, phase="acting")
    child = services.start_run(actor=actor, agent=world.agent, text=run.input)
    Run.objects.filter(pk=child.pk).update(facts={**child.facts, "parent_run": str(run.pk), "agent_depth": 1})
    # when the run is executed again (the sweeper re-enqueued it)
    services.execute_run(str(run.pk))
    # then the same child ran to its answer, which is the parent's, and nothing was routed twice
    run.refresh_from_db()
    [again] = _children(run)
    assert again.pk == child.pk and again.terminal_reason == "final_answer"
    assert (run.status, run.terminal_reason, run.output) == (RunStatus.FINISHED, "final_answer", again.output)
    types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert types == ["run.started", "supervisor.route", "supervisor.child_finished", "run.finished"]


def test_a_sub_agent_that_is_a_supervisor_routes_too_and_no_route_is_an_error_saying_why(world: World) -> None:
    inner = _agent(world, "inner", {"sub_agents": [ORDER], "rules": [{"agent": "order-assistant", "keywords": ["order"]}]})
    outer = _agent(world, "outer", {"sub_agents": [{"agent": "inner", "description": "the inner desk"}],
                                    "rules": [{"agent": "inner", "regex": "O\\d{12}"}]})
    actor = actor_for_api_key(world.key)
    run = services.start_run(actor=actor, agent=outer, text="where is order O202411280001?")
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    [middle] = _children(run)
    [leaf] = _children(middle)
    assert (middle.agent_id, leaf.agent_id) == (inner.pk, world.agent.pk)
    assert run.terminal_reason == middle.terminal_reason == leaf.terminal_reason == "final_answer"
    assert run.output == leaf.output and leaf.facts["agent_depth"] == 2
    # a request no rule matches, with no fallback, ends the run as an error naming why, with no child
    lost = services.start_run(actor=actor, agent=outer, text="tell me a joke")
    services.execute_run(str(lost.pk))
    lost.refresh_from_db()
    assert (lost.terminal_reason, _children(lost)) == ("error", [])
    assert lost.error == "no sub-agent for this request: no rule matched and there is no fallback"
    route = RunEvent.objects.get(run=lost, type="supervisor.route")
    assert route.payload["reason"] == "none"


def test_the_api_links_parent_and_child_for_the_tenant_only(world: World) -> None:
    from rest_framework.test import APIClient

    desk = _agent(world, "desk", {"sub_agents": [ORDER], "rules": [{"agent": "order-assistant", "intent": ["logistics"]}]})
    run = services.start_run(actor=actor_for_api_key(world.key), agent=desk, text="where is my parcel? order O202411280001")
    services.execute_run(str(run.pk))
    [child] = _children(run)
    own, foreign = APIClient(), APIClient()
    own.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    foreign.credentials(HTTP_AUTHORIZATION=f"Bearer {make_world().raw_key}")
    listed = own.get("/api/v1/runs", {"parent_run": str(run.pk)}).json()
    listed = listed["results"] if isinstance(listed, dict) else listed
    assert [r["id"] for r in listed] == [str(child.pk)]
    assert own.get(f"/api/v1/runs/{child.pk}").json()["parent_run"] == str(run.pk)
    assert own.get(f"/api/v1/runs/{run.pk}").json()["parent_run"] is None
    route = RunEvent.objects.get(run=run, type="supervisor.route").payload
    assert (route["reason"], route["intent"], route["rule"]) == ("rule", "logistics", 0)
    # another tenant's key sees neither the child through the filter nor either run
    other = foreign.get("/api/v1/runs", {"parent_run": str(run.pk)}).json()
    assert (other["results"] if isinstance(other, dict) else other) == []
    assert foreign.get(f"/api/v1/runs/{child.pk}").status_code == 404
    assert own.get("/api/v1/runs", {"parent_run": "not-a-uuid"}).status_code == 400


def _approver(world: World) -> Any:
    from accounts import services as tenant_services
    from tenants.models import Role
    from tests.factories import make_user

    user = make_user()
    tenant_services.set_membership(tenant=world.tenant, user=user, role=Role.APPROVER, actor=None)
    return user


def test_a_sub_agent_waiting_for_approval_pauses_the_supervisor_and_its_answer_finishes_it(world: World) -> None:
    from approvals.decisions import decide, resume_run
    from approvals.models import ApprovalRequest
    from tenants.scoping import actor_for_user
    from tools.models import Tool

    # given the order assistant's tool needs a human approval, and a supervisor routing to it
    Tool.objects.filter(tenant=world.tenant, name="query_order").update(requires_approval=True)
    desk = _agent(world, "desk", {"sub_agents": [ORDER], "fallback": "order-assistant"})
    run = services.start_run(actor=actor_for_api_key(world.key), agent=desk, text="What is the status of order O202411280001?")
    # when the worker routes and the child pauses for the approval
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    [child] = _children(run)
    # then the supervisor waits too (its worker freed), naming the child, and is not re-queued while the child waits
    assert (child.status, run.status, run.lease_token) == (RunStatus.WAITING, RunStatus.WAITING, "")
    assert run.facts["awaiting_child"] == str(child.pk)
    waiting = RunEvent.objects.get(run=run, type="supervisor.waiting").payload
    assert waiting["child_run"] == str(child.pk)
    assert services.resume_waiting_run(run.pk) is False
    # when the approver confirms and the child's worker runs it to its answer
    request = ApprovalRequest.objects.get(run=child)
    decide(actor=actor_for_user(_approver(world)), request_id=request.pk, approve=True)
    assert resume_run(child.pk)  # what the decision does once it commits
    services.execute_run(str(child.pk))
    child.refresh_from_db()
    assert child.terminal_reason == "final_answer"
    # then the supervisor was re-queued, and its next worker finishes it with the child's answer, routing nothing again
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert (run.status, run.terminal_reason, run.output) == (RunStatus.FINISHED, "final_answer", child.output)
    assert _children(run) == [child]
    types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert types == ["run.started", "supervisor.route", "supervisor.waiting", "supervisor.child_finished",
                     "run.finished"]


def test_cancelling_a_waiting_supervisor_cancels_the_sub_agent_it_waits_for(world: World) -> None:
    from tools.models import Tool

    Tool.objects.filter(tenant=world.tenant, name="query_order").update(requires_approval=True)
    desk = _agent(world, "desk", {"sub_agents": [ORDER], "fallback": "order-assistant"})
    actor = actor_for_api_key(world.key)
    run = services.start_run(actor=actor, agent=desk, text="What is the status of order O202411280001?")
    services.execute_run(str(run.pk))
    [child] = _children(Run.objects.get(pk=run.pk))
    services.cancel_run(actor=actor, run=run)
    run.refresh_from_db()
    child.refresh_from_db()
    assert (run.terminal_reason, child.terminal_reason) == ("cancelled", "cancelled")
