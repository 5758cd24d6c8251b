"""Issue 18 item 3 live: the demo refund of 300.00 is edited to 30.00 and approved; the write runs once, as edited."""

from __future__ import annotations

from typing import Any

import pytest

from accounts import services as tenant_services
from agents.models import RunMessage
from approvals.models import ApprovalRequest
from audit.models import ConfigChange, ToolCallAudit
from tenants.models import Role
from tests.support.deployment import set_env
from tools.arguments import arguments_hash

pytestmark = pytest.mark.integration

DEMO_KEY = "aok_ed180000_edits-demo-key-000"


def test_the_demo_refund_edited_from_300_to_30_runs_once_with_the_edit_and_the_model_reads_it(
    live_stack: Any, django_db_blocker: Any, unblocked_db: None, settings: Any
) -> None:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    set_env(settings, "DEMO_API_KEY", DEMO_KEY)
    set_env(settings, "DEMO_PASSWORD", "edits-walkthrough-password")
    call_command("seed_demo")
    approver = get_user_model().objects.get(username="approver")
    _key, approver_key = tenant_services.create_api_key(
        tenant=approver.memberships.get().tenant, name="edits", owner=approver, role=Role.APPROVER, actor=None
    )
    with live_stack.client(DEMO_KEY) as http:
        run_id = http.post(
            "/api/v1/runs", json={"agent": "order-assistant", "input": "refund 300.00 for order O202411280001 because the tea was spoiled"}
        ).json()["id"]
    body = live_stack.wait_for_run(DEMO_KEY, run_id, statuses=("waiting", "finished"))
    assert body["status"] == "waiting", body
    approval = ApprovalRequest.objects.get(run_id=run_id)
    assert approval.tool_name == "refund_order" and approval.arguments["amount"] == "300.00"
    original_hash = approval.arguments_hash

    with live_stack.client(approver_key) as http:
        bad = http.post(f"/api/v1/approvals/{approval.pk}/approve", json={"arguments": {"amount": "thirty"}})
        assert bad.status_code == 400 and "arguments.amount" in bad.text
        decided = http.post(f"/api/v1/approvals/{approval.pk}/approve",
                            json={"arguments": {"amount": "30.00"}, "arguments_hash": original_hash, "note": "only the tea"})
    assert decided.status_code == 200, decided.text
    edited = {**approval.arguments, "amount": "30.00"}
    assert decided.json()["status"] == "approved" and decided.json()["edited_hash"] == arguments_hash(edited)

    body = live_stack.wait_for_run(DEMO_KEY, run_id)
    assert body["terminal_reason"] == "final_answer", body
    rows = list(ToolCallAudit.objects.filter(run_id=run_id, tool_name="refund_order").order_by("chain_seq"))
    assert [r.status for r in rows] == ["pending_approval", "ok"], "one intent, exactly one dispatch"
    assert rows[0].arguments_hash == original_hash and "300.00" in rows[0].arguments_summary
    assert rows[1].arguments_hash == arguments_hash(edited) and "30.00" in rows[1].arguments_summary
    assert "300.00" not in rows[1].arguments_summary
    change = ConfigChange.objects.get(action="approval.approved", target_id=str(approval.pk))
    assert change.details["original_arguments"]["amount"] == "300.00" and change.details["edited_arguments"]["amount"] == "30.00"
    # what the model read next: the edit note and the tool's own result for 30.00 (the side effect, as the tool reports it)
    tool_messages = [m.message["content"] for m in RunMessage.objects.filter(run_id=run_id) if m.message.get("role") == "tool"]
    refund_results = [c for c in tool_messages if "approver edited the arguments" in c]
    assert len(refund_results) == 1, tool_messages
    assert 'amount: "300.00" → "30.00"' in refund_results[0]
    assert '"amount": "30.00"' in refund_results[0].replace('":"', '": "') and '"status": "refunded"' in refund_results[0].replace(
        '":"', '": "')
