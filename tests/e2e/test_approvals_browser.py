"""The approver's walkthrough in Chromium: a refund request appears live, Confirm, the run completes."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalRequest
from tests.e2e.conftest import SCREENSHOTS
from tests.factories import make_world
from tests.integration.test_approvals import Desk, RefundTarget, target  # noqa: F401 - the refund target fixture

PASSWORD = "correct-horse-battery"


@pytest.fixture
def desk(live_stack: Any, django_db_blocker: Any, target: str) -> Desk:  # noqa: F811
    with django_db_blocker.unblock():
        return Desk(make_world(), target)


def test_an_approver_sees_the_request_arrive_live_and_confirms_it(live_stack: Any, desk: Desk, page: Any, unblocked_db: None) -> None:
    approver = f"{desk.world.tenant.slug}-approver0"
    page.goto(f"{live_stack.base_url}/accounts/login/?next=/approvals/")
    page.fill("#id_username", approver)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/approvals/")
    page.wait_for_selector("#live-status[data-state=live]")
    assert "Nothing is waiting" in page.inner_text("#approval-list")

    # when a customer asks for a refund, the request appears without a reload
    before = len(RefundTarget.requests)
    with live_stack.client(desk.world.raw_key) as http:
        run_id = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": "refund order O202411280001"}).json()["id"]
    row = page.wait_for_selector("tr[data-approval-id]", timeout=20_000)
    approval = ApprovalRequest.objects.get(run_id=run_id)
    assert row.get_attribute("data-approval-id") == str(approval.pk)
    text = page.inner_text("#approval-list")
    assert "refund_order" in text and "refund order O202411280001" in text and "/refunds/O202411280001" in text
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "approvals.png"), full_page=True)

    # Confirm: the run resumes and completes, and the target got exactly one request
    page.click(f"tr[data-approval-id='{approval.pk}'] button.confirm")
    page.wait_for_selector("text=Approved.")
    body = live_stack.wait_for_run(desk.world.raw_key, run_id)
    assert body["terminal_reason"] == "final_answer"
    assert len(RefundTarget.requests) == before + 1
    page.wait_for_selector("#approval-summary.empty")
    assert not page.js_errors
