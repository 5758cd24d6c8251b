"""Human approvals end to end: the run pauses, a person decides, the call runs exactly once (or never)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from accounts import services as tenant_services
from agents.models import Run, RunMessage
from approvals.models import ApprovalRequest
from audit.models import ConfigChange, ToolCallAudit
from tenants.models import Role
from tests.factories import World, make_user, make_world
from tests.support.deployment import set_env
from tests.support.refund_target import RefundTarget, add_refund_tool, serve_refund_target
from tools.models import Tool

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    with serve_refund_target() as url:
        yield url


class Desk:
    """A tenant with an HTTP refund tool that needs approval, and people in each role."""

    def __init__(self, world: World, target: str) -> None:
        self.world = world
        self.tool = add_refund_tool(world, target)
        self.approvers = []
        for n in range(2):
            user = make_user(f"{world.tenant.slug}-approver{n}")
            tenant_services.set_membership(tenant=world.tenant, user=user, role=Role.APPROVER, actor=None)
            _key, raw = tenant_services.create_api_key(tenant=world.tenant, name=f"approver{n}", owner=user, role=Role.APPROVER, actor=None)
            self.approvers.append(raw)


@pytest.fixture(scope="module")
def desks(live_stack: Any, django_db_blocker: Any, target: str) -> tuple[Desk, World]:
    with django_db_blocker.unblock():
        return Desk(make_world(), target), make_world()


def _refund(live_stack: Any, desk: Desk, order: str) -> tuple[str, ApprovalRequest]:
    with live_stack.client(desk.world.raw_key) as http:
        response = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": f"please refund order {order}"})
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    body = live_stack.wait_for_run(desk.world.raw_key, run_id, statuses=("waiting", "finished"))
    if body["status"] != "waiting":
        with live_stack.client(desk.world.raw_key) as http:
            events = http.get(f"/api/v1/runs/{run_id}/events").json()["events"]
        raise AssertionError(f"the run did not wait for approval: {body}\n{json.dumps(events, indent=1)[:6000]}")
    return run_id, ApprovalRequest.objects.get(run_id=run_id)


def _decide(live_stack: Any, key: str, approval: ApprovalRequest, verb: str, note: str = "") -> Any:
    with live_stack.client(key) as http:
        return http.post(f"/api/v1/approvals/{approval.pk}/{verb}", json={"note": note})


def _requests_for(order: str) -> list[dict[str, Any]]:
    return [r for r in RefundTarget.requests if r["path"] == f"/refunds/{order}"]


def test_an_approved_call_runs_exactly_once_and_the_audit_shows_intent_decision_and_dispatch(
    live_stack: Any, desks: Any, unblocked_db: None
) -> None:
    desk, _other = desks
    before = len(_requests_for("O202411280001"))
    run_id, approval = _refund(live_stack, desk, "O202411280001")
    # the task ended: no worker holds the run while it waits
    run = Run.objects.get(pk=run_id)
    assert run.lease_token == "" and run.phase == "waiting"
    assert approval.status == "pending" and approval.preview["request"]["method"] == "POST"
    assert approval.preview["request"]["url"].endswith("/refunds/O202411280001")
    assert len(_requests_for("O202411280001")) == before
    # the operator who started the run cannot approve it (wrong role) — and the owner of the key could not either
    assert _decide(live_stack, desk.world.raw_key, approval, "approve").status_code == 403
    with live_stack.client() as http:
        scraped = http.get("/metrics").text
    assert f'agentops_approvals_pending{{tenant="{desk.world.tenant.slug}"}} 1.0' in scraped
    assert f'agentops_approval_oldest_pending_seconds{{tenant="{desk.world.tenant.slug}"}}' in scraped
    first = _decide(live_stack, desk.approvers[0], approval, "approve")
    assert first.status_code == 200 and first.json()["status"] == "approved"
    second = _decide(live_stack, desk.approvers[1], approval, "approve")
    assert second.status_code == 409 and "already approved" in second.json()["detail"]
    body = live_stack.wait_for_run(desk.world.raw_key, run_id)
    assert body["terminal_reason"] == "final_answer", body
    assert len(_requests_for("O202411280001")) == before + 1
    statuses = list(
        ToolCallAudit.objects.filter(run_id=run_id, tool_name="refund_order").order_by("chain_seq").values_list("status", flat=True)
    )
    assert statuses == ["pending_approval", "ok"], "the intent and the dispatch are separate rows"
    assert ConfigChange.objects.filter(action="approval.approved", target_id=str(approval.pk)).exists()
    with live_stack.client() as http:
        scraped = http.get("/metrics").text
    assert 'agentops_approval_decisions_total{outcome="approved"}' in scraped
    assert f'agentops_approvals_pending{{tenant="{desk.world.tenant.slug}"}}' not in scraped


def test_a_rejected_call_never_runs_and_the_model_reads_the_note(live_stack: Any, desks: Any, unblocked_db: None) -> None:
    desk, _other = desks
    before = len(_requests_for("O202411280002"))
    run_id, approval = _refund(live_stack, desk, "O202411280002")
    assert _decide(live_stack, desk.approvers[0], approval, "reject", "customer already got a voucher").status_code == 200
    body = live_stack.wait_for_run(desk.world.raw_key, run_id)
    assert body["terminal_reason"] == "final_answer"
    assert len(_requests_for("O202411280002")) == before
    tool_messages = [m.message for m in RunMessage.objects.filter(run_id=run_id) if m.message.get("role") == "tool"]
    assert any("rejected by an approver: customer already got a voucher" in m["content"] for m in tool_messages)
    assert list(
        ToolCallAudit.objects.filter(run_id=run_id, tool_name="refund_order").order_by("chain_seq").values_list("status", flat=True)
    ) == ["pending_approval", "rejected"]


def test_an_expired_request_is_refused_and_the_call_never_runs(live_stack: Any, desks: Any, unblocked_db: None) -> None:
    desk, _other = desks
    before = len(_requests_for("O202411280003"))
    run_id, approval = _refund(live_stack, desk, "O202411280003")
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=approval.requested_at)
    late = _decide(live_stack, desk.approvers[0], approval, "approve")
    assert late.status_code == 409 and "expired" in late.json()["detail"]
    body = live_stack.wait_for_run(desk.world.raw_key, run_id)
    assert body["terminal_reason"] == "final_answer"
    assert len(_requests_for("O202411280003")) == before
    tool_messages = [m.message["content"] for m in RunMessage.objects.filter(run_id=run_id) if m.message.get("role") == "tool"]
    assert any("approval expired" in c for c in tool_messages)


def test_four_eyes_needs_two_different_people(live_stack: Any, desks: Any, unblocked_db: None) -> None:
    desk, _other = desks
    Tool.objects.filter(pk=desk.tool.pk).update(approval_policy={"mode": "always", "four_eyes": True})
    try:
        before = len(RefundTarget.requests)
        with live_stack.client(desk.world.raw_key) as http:
            run_id = http.post(
                "/api/v1/runs", json={"agent": "order-assistant", "input": "refund order O202411280001 again please"}
            ).json()["id"]
        live_stack.wait_for_run(desk.world.raw_key, run_id, statuses=("waiting", "finished"))
        approval = ApprovalRequest.objects.get(run_id=run_id)
        assert approval.required_approvals == 2
        assert _decide(live_stack, desk.approvers[0], approval, "approve").json()["status"] == "pending"
        again = _decide(live_stack, desk.approvers[0], approval, "approve")
        assert again.status_code == 409 and "different second approver" in again.json()["detail"]
        time.sleep(0.5)
        assert Run.objects.get(pk=run_id).status == "waiting"
        assert _decide(live_stack, desk.approvers[1], approval, "approve").json()["status"] == "approved"
        live_stack.wait_for_run(desk.world.raw_key, run_id)
        # the duplicate guard would block a second identical refund in this session; this one is a new session
        assert len(RefundTarget.requests) == before + 1
    finally:
        Tool.objects.filter(pk=desk.tool.pk).update(approval_policy={})


def test_another_tenant_cannot_see_or_decide(live_stack: Any, desks: Any, unblocked_db: None) -> None:
    desk, other = desks
    run_id, approval = _refund(live_stack, desk, "O202411280002")
    with live_stack.client(other.raw_key) as http:
        assert http.get(f"/api/v1/approvals/{approval.pk}").status_code == 404
        assert http.post(f"/api/v1/approvals/{approval.pk}/approve", json={}).status_code == 404
        assert all(item["id"] != str(approval.pk) for item in http.get("/api/v1/approvals?status=pending").json()["results"])
    with live_stack.client(desk.approvers[1]) as http:
        listed = http.get("/api/v1/approvals?status=pending").json()["results"]
        assert str(approval.pk) in [item["id"] for item in listed]
        assert http.get("/api/v1/approvals?status=bogus").status_code == 400
    with live_stack.client(desk.world.raw_key) as http:
        assert http.post(f"/api/v1/runs/{run_id}/cancel").status_code == 202
    live_stack.wait_for_run(desk.world.raw_key, run_id)
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "cancelled"


def test_whoever_started_the_run_cannot_approve_its_calls(live_stack: Any, desks: Any, unblocked_db: None) -> None:
    desk, _other = desks
    owner = make_user(f"{desk.world.tenant.slug}-owner")
    tenant_services.set_membership(tenant=desk.world.tenant, user=owner, role=Role.OWNER, actor=None)
    _key, raw = tenant_services.create_api_key(tenant=desk.world.tenant, name="owner", owner=owner, role=Role.OWNER, actor=None)
    with live_stack.client(raw) as http:
        run_id = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": "refund order O202411280002"}).json()["id"]
    live_stack.wait_for_run(raw, run_id, statuses=("waiting", "finished"))
    approval = ApprovalRequest.objects.get(run_id=run_id)
    refused = _decide(live_stack, raw, approval, "approve")
    assert refused.status_code == 403 and "You started this run" in refused.json()["detail"]
    assert _decide(live_stack, desk.approvers[0], approval, "reject", "no").status_code == 200
    live_stack.wait_for_run(raw, run_id)


def test_the_demo_walkthrough_refund_approved_then_done(
    live_stack: Any, django_db_blocker: Any, unblocked_db: None, monkeypatch: pytest.MonkeyPatch
, settings: Any) -> None:
    # given the seeded demo (order-desk installed, its refund_order needs approval)
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    set_env(settings, "DEMO_API_KEY", "aok_d3e40000_walkthrough-demo-key")
    set_env(settings, "DEMO_PASSWORD", "walkthrough-password")
    call_command("seed_demo")
    approver = get_user_model().objects.get(username="approver")
    _key, approver_key = tenant_services.create_api_key(
        tenant=approver.memberships.get().tenant, name="walkthrough", owner=approver, role=Role.APPROVER, actor=None
    )
    demo_key = "aok_d3e40000_walkthrough-demo-key"
    # when a customer asks for a refund
    with live_stack.client(demo_key) as http:
        run_id = http.post(
            "/api/v1/runs", json={"agent": "order-assistant", "input": "refund 30.00 for order O202411280002 because the notebook was torn"}
        ).json()["id"]
    body = live_stack.wait_for_run(demo_key, run_id, statuses=("waiting", "finished"))
    assert body["status"] == "waiting", body
    approval = ApprovalRequest.objects.get(run_id=run_id)
    assert approval.tool_name == "refund_order" and approval.arguments["amount"] == "30.00"
    # then an approver confirms and the run completes with the refund done once
    assert _decide(live_stack, approver_key, approval, "approve").status_code == 200
    body = live_stack.wait_for_run(demo_key, run_id)
    assert body["terminal_reason"] == "final_answer" and "refunded" in body["output"], body["output"]
    statuses = list(
        ToolCallAudit.objects.filter(run_id=run_id, tool_name="refund_order").order_by("chain_seq").values_list("status", flat=True)
    )
    assert statuses == ["pending_approval", "ok"]
