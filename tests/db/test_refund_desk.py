"""Issue #15, the demo: seed_demo's refund desk flow, above the threshold (a manager's approval node, then the refund
tool's own approval) and below it (the tool's approval only), to the llm node's summary."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.test import APIClient

from agents import services
from agents.models import Run, RunStatus
from approvals.decisions import decide
from approvals.models import ApprovalRequest, ApprovalStatus
from flows.models import FlowNodeRun
from marketplace.builtin import order_desk
from tenants.scoping import actor_for_user

pytestmark = pytest.mark.django_db

KEY = "aok_0123abcd_refund-desk-test-key"


@pytest.fixture
def demo(settings: Any, tmp_path: Any) -> APIClient:
    settings.DEMO_API_KEY, settings.DEMO_PASSWORD, settings.VAR_DIR = KEY, "refund-desk-password", tmp_path
    call_command("seed_demo")
    order_desk.REFUNDS.clear()
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {KEY}")
    return client


def _drain(run: Run) -> None:
    from flows.runner import execute_node

    while rows := list(FlowNodeRun.objects.filter(run=run, status="running")):
        for row in rows:
            execute_node(str(run.pk), row.node_id, row.lease_token)
    run.refresh_from_db()


def _approve_pending(run: Run) -> str:
    request = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
    approver = actor_for_user(get_user_model().objects.get(username="approver"))
    decide(actor=approver, request_id=request.pk, approve=True)
    assert services.resume_waiting_run(run.pk)
    services.execute_run(str(run.pk))
    _drain(run)
    return request.tool_name


@pytest.mark.parametrize(("amount", "gates"), [("250.00", ["flow:manager", "refund_order"]), ("30.00", ["refund_order"])])
def test_the_refund_desk_runs_to_its_summary_through_its_approvals(demo: APIClient, amount: str, gates: list[str]) -> None:
    started = demo.post("/api/v1/runs", {"flow": "refund-desk", "input": {
        "order_id": "O202411280001", "amount": amount, "reason": "damaged cup"}}, format="json")
    assert started.status_code == 202, started.content
    run = Run.objects.get(pk=started.json()["id"])
    services.execute_run(str(run.pk))
    _drain(run)
    asked = []
    while run.status == RunStatus.WAITING:
        asked.append(_approve_pending(run))
    assert asked == gates
    assert run.terminal_reason == "final_answer", run.error
    assert f"was refunded {amount} CNY" in run.output and "Li Wei" in run.output
    assert [r["amount"] for r in order_desk.REFUNDS[run.tenant_id]["O202411280001"]] == [amount]  # refunded once, its tenant's


def test_a_flow_approval_node_announces_its_request_as_a_tool_approval_does(
        demo: APIClient, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    # issue #50's fault suite: 118 "flow:manager" requests, not one announced to the tenant's channels
    from approvals import tasks

    announced: list[tuple[str, str]] = []
    monkeypatch.setattr(tasks.notify_task, "delay", lambda request_id, event: announced.append((request_id, event)))
    started = demo.post("/api/v1/runs", {"flow": "refund-desk", "input": {
        "order_id": "O202411280001", "amount": "250.00", "reason": "damaged cup"}}, format="json")
    run = Run.objects.get(pk=started.json()["id"])
    with django_capture_on_commit_callbacks(execute=True):
        services.execute_run(str(run.pk))
        _drain(run)
    request = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
    assert request.tool_name == "flow:manager"
    assert announced == [(str(request.pk), "arrived")]
