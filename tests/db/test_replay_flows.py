"""Issue #16 for flows: a recorded refund-desk flow run replayed on its own version and on a changed graph."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from agents import services
from agents.models import Agent, AgentVersion, Run, RunEvent
from audit.models import ToolCallAudit
from flows.models import FlowNodeRun
from marketplace.builtin import order_desk
from releases import services as releases
from releases.models import ReplayRun
from tenants.scoping import actor_for_user
from tests.db.test_refund_desk import KEY, _approve_pending, _drain

pytestmark = pytest.mark.django_db


@pytest.fixture
def refunded(settings: Any, tmp_path: Any) -> Run:
    settings.DEMO_API_KEY, settings.DEMO_PASSWORD, settings.VAR_DIR = KEY, "refund-desk-password", tmp_path
    call_command("seed_demo")
    order_desk.REFUNDS.clear()
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {KEY}")
    started = client.post("/api/v1/runs", {"flow": "refund-desk", "input": {
        "order_id": "O202411280001", "amount": "250.00", "reason": "damaged cup"}}, format="json")
    assert started.status_code == 202, started.content
    run = Run.objects.get(pk=started.json()["id"])
    services.execute_run(str(run.pk))
    _drain(run)
    while run.status == "waiting":
        _approve_pending(run)
    assert run.terminal_reason == "final_answer", run.error
    return run


def _replay(run: Run, version: AgentVersion, name: str) -> ReplayRun:
    from django.contrib.auth import get_user_model

    actor = actor_for_user(get_user_model().objects.get(username="operator"))
    s = releases.create_evaluation_set(tenant=run.tenant, actor=actor, name=name, agent=run.agent, run_ids=[run.pk])
    batch = releases.start_replay(tenant=run.tenant, actor=actor, evaluation_set=s, candidate=version, concurrency=1,
                                  checks=[{"check": "no_diff"}])
    releases.run_shard(batch.pk, 0, 1)
    return ReplayRun.objects.get(batch=batch)


def test_a_flow_run_replays_exactly_on_its_own_version_and_shows_a_changed_threshold(refunded: Run) -> None:
    refunds = json.dumps(order_desk.REFUNDS, sort_keys=True)
    before = (Run.objects.count(), RunEvent.objects.count(), ToolCallAudit.objects.count(), FlowNodeRun.objects.count())
    same = _replay(refunded, refunded.version, "refunds")
    assert same.status == "replayed", same.error
    assert same.diff["changed"] == [] and same.passed, same.diff
    assert sorted(same.diff["approvals"]["recorded"]) == ["flow:manager", "refund_order"]
    assert {c["tool"] for c in same.diff["tools"]["replayed"]} == {"query_order", "query_logistics", "refund_order"}
    assert same.live_tool_calls == 0
    assert (Run.objects.count(), RunEvent.objects.count(), ToolCallAudit.objects.count(), FlowNodeRun.objects.count()) == before
    assert json.dumps(order_desk.REFUNDS, sort_keys=True) == refunds, "no refund ran again"

    flow = Agent.objects.get(slug="refund-desk")
    definition = copy.deepcopy(refunded.version.definition)
    route = next(n for n in definition["nodes"] if n["id"] == "route")
    route["cases"][0]["when"] = "to_number(input.amount) > `1000`"  # the manager only above 1000 now
    lenient = AgentVersion.objects.create(tenant=flow.tenant, agent=flow, number=refunded.version.number + 1,
                                          model=refunded.version.model, definition=definition)
    changed = _replay(refunded, lenient, "refunds-again")
    assert changed.passed is False
    assert changed.diff["approvals"]["replayed"] == ["refund_order"], changed.diff["approvals"]
    assert "approvals" in changed.diff["changed"] and "steps" in changed.diff["changed"]
    assert changed.diff["steps"]["replayed"] == changed.diff["steps"]["recorded"] - 1
    assert changed.diff["answer"]["same"], "the refund and its summary are the recorded ones"
    assert json.dumps(order_desk.REFUNDS, sort_keys=True) == refunds
