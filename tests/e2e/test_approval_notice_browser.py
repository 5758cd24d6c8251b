"""From the notice to the decision in Chromium: the approver opens the link a webhook (and the mail) carried,
signs in, lands on the request, and confirms it; the run completes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.test_approval_notify import (  # noqa: F401 - the sink and mail folder fixtures
    SIGNING_SECRET,
    WebhookSink,
    desk,
    maildir,
    notice_stack,
    sink,
)
from tests.support.live_stack import LiveStack

PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="module")
def live_stack(notice_stack: LiveStack) -> LiveStack:  # noqa: F811 - the browser fixture starts after this stack
    return notice_stack


def test_an_approver_follows_the_notice_link_to_the_request_and_confirms_it(
    live_stack: LiveStack, desk: Any, sink: WebhookSink, maildir: Path, page: Any, unblocked_db: None  # noqa: F811
) -> None:
    world, _approver_key, _target = desk
    with live_stack.client(world.raw_key) as http:
        created = http.post("/api/v1/notification-channels", json={
            "name": "browser-hook", "kind": "webhook_json", "target": f"{sink.url}/browser", "events": ["arrived"],
            "secret": "secret:HOOKS"})
        assert created.status_code == 201, created.text
        mailed = http.post("/api/v1/notification-channels", json={"name": "browser-mail", "kind": "email", "events": ["arrived"]})
        assert mailed.status_code == 201, mailed.text
        run_id = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": "refund order O202411280077"}).json()["id"]
    deadline = time.monotonic() + 40
    while not (sink.at("/browser") and any(maildir.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.2)
    [notice] = sink.at("/browser")
    link = json.loads(notice["body"])["url"]
    assert link in "".join(p.read_text() for p in maildir.iterdir())  # the mail carries the same link

    # the link's path on this server (PUBLIC_BASE_URL names a placeholder host in the test)
    page.goto(live_stack.base_url + urlsplit(link).path)
    page.wait_for_url("**/accounts/login/**")
    page.fill("#id_username", world.approver.get_username())
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"**{urlsplit(link).path}")
    assert "refund_order" in page.inner_text("main") and "pending" in page.inner_text("main")
    page.click("form.decide button.confirm")
    page.wait_for_selector("text=Approved.")
    body = live_stack.wait_for_run(world.raw_key, run_id)
    assert body["terminal_reason"] == "final_answer"
    assert not page.js_errors
    assert SIGNING_SECRET not in notice["body"]
