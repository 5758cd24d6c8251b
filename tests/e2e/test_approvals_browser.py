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


def test_the_approver_reads_time_left_reveals_a_masked_field_and_the_trace_says_who_decided(
    live_stack: Any, desk: Desk, page: Any, unblocked_db: None,
) -> None:
    import re

    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    from audit.models import ConfigChange

    # given the refund tool masks the order number for approvers, and approver0 may reveal masked fields
    desk.tool.sensitive_fields = ["order_id"]
    desk.tool.save(update_fields=["sensitive_fields"])
    approver = f"{desk.world.tenant.slug}-approver0"
    get_user_model().objects.get(username=approver).user_permissions.add(Permission.objects.get(codename="reveal_sensitive_fields"))
    page.goto(f"{live_stack.base_url}/accounts/login/?next=/approvals/")
    page.fill("#id_username", approver)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/approvals/")
    page.wait_for_selector("#live-status[data-state=live]")

    with live_stack.client(desk.world.raw_key) as http:
        run_id = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": "refund order O202411280001"}).json()["id"]
    row = page.wait_for_selector("tr[data-approval-id]", timeout=20_000)
    approval = ApprovalRequest.objects.get(run_id=run_id)
    # the list: time left as a person reads it, and the run's trace one click away
    humanized = re.compile(r"^(\d+ min|\d+ h( \d+ min)?|\d+ d( \d+ h)?)$")
    assert humanized.match(row.query_selector("td.time-left").inner_text().strip()), row.inner_text()
    assert row.query_selector("a.trace-link").get_attribute("href") == f"/console/runs/{run_id}/"

    # the request's page: masked until revealed, then shown to this approver, with an audit row
    page.click(f"tr[data-approval-id='{approval.pk}'] a[href='/approvals/{approval.pk}/']")
    page.wait_for_selector("#time-left")
    assert humanized.match(page.inner_text("#time-left").strip())
    assert "s left" not in page.inner_text("dl.facts")
    # the page's script says it as the server does, and counts down: 61 s left reads "1 min", then "59 s"
    from approvals.timeleft import humanize_seconds
    for seconds in (0, 45, 60, 3532, 3900, 97_200):
        assert page.evaluate(f"window.approvalTimeLeft({seconds})") == humanize_seconds(seconds)
    page.evaluate("""() => { const s = document.createElement('span'); s.id = 'probe'; s.dataset.secondsLeft = '61';
                            document.body.appendChild(s); }""")
    page.wait_for_function("() => document.getElementById('probe').textContent === '1 min'", timeout=3_000)
    page.wait_for_function("() => /^5\\d s$/.test(document.getElementById('probe').textContent)", timeout=5_000)
    cell = page.inner_text("tr[data-argument='order_id']")
    assert "******" in cell and "O202411280001" not in cell
    assert "/refunds/******" in page.inner_text("pre.preview"), "masked in the request's URL too"
    page.click("tr[data-argument='order_id'] button.reveal")
    page.wait_for_selector("tr[data-argument='order_id'] .revealed")
    assert page.inner_text("tr[data-argument='order_id'] .revealed") == "O202411280001"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "approval-reveal.png"), full_page=True)
    assert ConfigChange.objects.filter(action="approval.field_revealed", target_id=str(approval.pk), details__field="order_id").count() == 1

    # Confirm with a note; the run finishes, and its trace says who decided and with what note
    page.fill("form.decide input[name=note]", "checked with the customer")
    page.click("form.decide button.confirm")
    page.wait_for_selector("text=Approved.")
    assert live_stack.wait_for_run(desk.world.raw_key, run_id)["terminal_reason"] == "final_answer"
    page.click("a.trace-link")
    page.wait_for_url(f"**/console/runs/{run_id}/")
    page.wait_for_selector("text=decided by", timeout=20_000)
    trace = page.inner_text("body")
    assert approver in trace and "checked with the customer" in trace
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "approval-trace.png"), full_page=True)
    assert not page.js_errors


def test_the_approver_edits_the_arguments_in_the_page_and_the_edited_call_runs(
    live_stack: Any, desk: Desk, page: Any, unblocked_db: None,
) -> None:
    from agents.models import RunMessage

    approver = f"{desk.world.tenant.slug}-approver0"
    page.goto(f"{live_stack.base_url}/accounts/login/?next=/approvals/")
    page.fill("#id_username", approver)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url("**/approvals/")
    before = [r["path"] for r in RefundTarget.requests]
    with live_stack.client(desk.world.raw_key) as http:
        run_id = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": "refund order O202411280001"}).json()["id"]
    live_stack.wait_for_run(desk.world.raw_key, run_id, statuses=("waiting", "finished"))
    approval = ApprovalRequest.objects.get(run_id=run_id)
    page.goto(f"{live_stack.base_url}/approvals/{approval.pk}/")
    assert page.input_value("form.edit input[name='arg:order_id']") == "O202411280001"

    # a value the tool's schema refuses: the page comes back with the error, nothing decided
    page.fill("form.edit input[name='arg:order_id']", "O123")
    page.click("form.edit button.approve-edited")
    page.wait_for_selector("ul.edit-errors")
    assert "arguments.order_id: expected" in page.inner_text("ul.edit-errors")
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"

    # the right order: approved with the edit, shown next to the original, and that call is the one made
    page.fill("form.edit input[name='arg:order_id']", "O202411280002")
    page.fill("form.edit input[name=note]", "the customer meant the other order")
    page.click("form.edit button.approve-edited")
    page.wait_for_selector("text=Approved with your edits.")
    row = page.inner_text("tr[data-edited='order_id']")
    assert "O202411280001" in row and "O202411280002" in row
    assert page.query_selector("tr[data-edited='order_id'] del.old") and page.query_selector("tr[data-edited='order_id'] ins.new")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "approval-edited.png"), full_page=True)
    assert live_stack.wait_for_run(desk.world.raw_key, run_id)["terminal_reason"] == "final_answer"
    made = [r["path"] for r in RefundTarget.requests][len(before):]
    assert made == ["/refunds/O202411280002"], made
    tool_messages = [m.message["content"] for m in RunMessage.objects.filter(run_id=run_id) if m.message.get("role") == "tool"]
    assert any('order_id: "O202411280001" → "O202411280002"' in c for c in tool_messages), tool_messages
    assert not page.js_errors
