"""The console in Chromium: log in, watch a run's trace stream, reload mid-run, see every span exactly once.

Also: model output with ``<script>`` renders as text and never runs; the run list takes new runs
live; screenshots of the trace and the spend view land in docs/screenshots/ for the README.
"""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Run, RunEvent, RunStatus
from tests.e2e.builders import SCRIPT_OUTPUT, add_events, make_run, trace_events
from tests.e2e.conftest import SCREENSHOTS
from tests.factories import World, make_world

pytestmark = [pytest.mark.integration, pytest.mark.browser]

PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="module")
def world(live_stack: Any, django_db_blocker: Any) -> World:
    with django_db_blocker.unblock():
        return make_world()


def log_in(page: Any, live_stack: Any, username: str) -> None:
    page.goto(f"{live_stack.base_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_stack.base_url}/console/runs/")


def start_run(live_stack: Any, key: str, text: str = "what is in order O202411280002?") -> str:
    with live_stack.client(key) as http:
        response = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": text})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def shown_seqs(page: Any) -> list[int]:
    """The seq of every event the page shows, sorted (the tree nests children under their span); duplicates fail."""
    seqs = [int(s) for s in page.eval_on_selector_all("#spans [data-seq]", "nodes => nodes.map(n => n.dataset.seq)")]
    assert len(seqs) == len(set(seqs)), f"an event is shown twice: {sorted(seqs)}"
    return sorted(seqs)


def wait_finished(page: Any, timeout_ms: int = 30_000) -> None:
    page.wait_for_selector("#trace[data-finished='true']", state="attached", timeout=timeout_ms)


def stored_seqs(run_id: Any) -> list[int]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))


def test_an_operator_watches_a_demo_run_stream_and_a_reload_mid_run_loses_nothing(
    page: Any, live_stack: Any, world: World, unblocked_db: None
) -> None:
    # given an operator logged in through the login form, on the live run list
    log_in(page, live_stack, world.operator.username)
    page.wait_for_selector("#live-status[data-state='live']")
    # when a run starts through the API, it appears in the list live and finishes there
    run_id = start_run(live_stack, world.raw_key)
    page.wait_for_selector(f"tr[data-run-id='{run_id}'][data-status='finished']")
    # and the trace page shows its spans, also after a reload in the middle of another run
    second = start_run(live_stack, world.raw_key, "where is order O202411280001?")
    page.goto(f"{live_stack.base_url}/console/runs/{second}/")
    page.wait_for_selector("#spans [data-seq]", state="attached")
    page.reload()
    wait_finished(page)
    seqs = shown_seqs(page)
    assert seqs == stored_seqs(second), "every event exactly once, in order, after the reload"
    assert seqs == list(range(1, len(seqs) + 1))
    assert page.locator("#spans li.k-model[data-type='model.call']").count() >= 1
    assert page.locator("#spans li.k-tool[data-type='tool.call']").count() >= 1
    assert page.locator("#spans [data-type='run.finished']").count() == 1
    assert not page.js_errors, page.js_errors
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "run-trace.png"), full_page=True)


def test_a_paused_run_streams_live_and_both_a_watching_and_a_reloaded_page_end_complete(
    page: Any, live_stack: Any, world: World, unblocked_db: None
) -> None:
    # given a run paused at an approval, with half of its trace committed
    events = trace_events("never shown", finished=False)
    run = make_run(world, status=RunStatus.WAITING, with_events=False)
    add_events(run, events[:6])
    Run.objects.filter(pk=run.pk).update(phase="waiting")
    log_in(page, live_stack, world.operator.username)
    page.goto(f"{live_stack.base_url}/console/runs/{run.pk}/")
    page.wait_for_selector("#live-status[data-state='live']")
    assert shown_seqs(page) == [1, 2, 3, 4, 5, 6]
    # a second tab keeps watching without a reload
    watcher = page.context.new_page()
    watcher_errors: list[str] = []
    watcher.on("pageerror", lambda exc: watcher_errors.append(str(exc)))
    watcher.goto(f"{live_stack.base_url}/console/runs/{run.pk}/")
    watcher.wait_for_selector("#live-status[data-state='live']")
    # when more of the trace commits without a live message (a dropped publish), the first tab reloads mid-run
    add_events(run, events[6:])
    page.reload()
    page.wait_for_selector("#live-status[data-state='live']")
    assert shown_seqs(page) == stored_seqs(run.pk)
    approval = page.locator("a.approval-link")
    assert approval.get_attribute("href") == "/approvals/42/"
    # and when the run is cancelled, its closing events arrive live on both tabs (the watcher fills the gap)
    with live_stack.client(world.raw_key) as http:
        assert http.post(f"/api/v1/runs/{run.pk}/cancel").status_code == 202
    for tab in (page, watcher):
        wait_finished(tab)
        assert shown_seqs(tab) == stored_seqs(run.pk) == list(range(1, len(events) + 3))
        assert tab.locator("#run-status .badge.reason-cancelled").count() == 1
    assert not page.js_errors and not watcher_errors, (page.js_errors, watcher_errors)


def test_model_output_with_script_renders_as_text(page: Any, live_stack: Any, world: World, unblocked_db: None) -> None:
    # given a finished run whose model answered with markup
    run = make_run(world, content=SCRIPT_OUTPUT)
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, live_stack, world.operator.username)
    # when its trace is opened
    response = page.goto(f"{live_stack.base_url}/console/runs/{run.pk}/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    wait_finished(page)
    page.locator("#spans li[data-type='model.call'] details summary").last.click()
    # then the markup is visible as text and nothing ran
    assert page.evaluate("window.__pwned") is None
    assert page.title() != "pwned" and not dialogs
    assert SCRIPT_OUTPUT in page.locator("#run-output").inner_text()
    assert SCRIPT_OUTPUT in page.locator("#spans li[data-type='model.call'] pre.text").last.inner_text()
    assert page.locator("#spans script, #spans img").count() == 0


def test_the_spend_view_charts_the_tenants_runs(page: Any, live_stack: Any, world: World, unblocked_db: None) -> None:
    make_run(world, usage={"input_tokens": 4200, "output_tokens": 800, "cost": 0.042})
    log_in(page, live_stack, world.operator.username)
    page.goto(f"{live_stack.base_url}/console/spend/?days=7")
    assert page.locator("#spend-chart rect.col").count() == 7
    link = page.locator("a[href^='/console/runs/?agent=']").first
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "spend.png"), full_page=True)
    link.click()
    page.wait_for_url(f"{live_stack.base_url}/console/runs/?agent=*")
    assert page.locator("tr[data-run-id]").count() >= 1
    assert not page.js_errors, page.js_errors
