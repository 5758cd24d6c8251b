"""The playground in Chromium: an operator picks an agent and a version, sends a message, and watches the run.

Its own live stack (both run modes, as every live test) whose OpenAI-compatible provider is the local streaming
test server (tests/support/fake_openai.py): the demo planner's version sends no deltas (the answer comes from the
committed events), the OpenAI version streams its reply, and the page shows it growing before the final answer.
"""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import AgentVersion, Run, RunEvent
from approvals.models import ApprovalRequest
from tests.e2e.conftest import SCREENSHOTS
from tests.factories import World, make_world
from tests.integration.test_approvals import Desk, target  # noqa: F401 - the refund target fixture
from tests.support.fake_openai import FakeOpenAI, text
from tests.support.live_stack import LiveStack
from tests.support.stream_stack import WORDS

pytestmark = [pytest.mark.integration, pytest.mark.browser]

PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="module")
def live_stack(stack: LiveStack) -> LiveStack:
    """This module's stack (the browser fixture uses it): the worker's OpenAI provider is the streaming test server."""
    return stack


@pytest.fixture(scope="module")
def world(live_stack: LiveStack, django_db_blocker: Any) -> tuple[World, AgentVersion]:
    """The demo agent (v1, current: demo/planner) and a second, unreleased version on the OpenAI provider."""
    with django_db_blocker.unblock():
        world = make_world()
        v2 = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="openai/gpt-4o-mini",
                                         system_prompt="Answer briefly.", tools=[], policy=world.version.policy,
                                         note="streaming candidate")
        return world, v2


def open_playground(page: Any, live_stack: LiveStack, username: str) -> None:
    page.goto(f"{live_stack.base_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_stack.base_url}/console/runs/")
    page.click("nav.nav >> text=Playground")
    page.wait_for_url(f"{live_stack.base_url}/console/playground/")


def test_the_demo_agent_answers_with_its_steps_and_the_trace_link_works(
    page: Any, live_stack: LiveStack, world: tuple[World, AgentVersion], unblocked_db: None
) -> None:
    w, _ = world
    open_playground(page, live_stack, w.operator.username)
    # given the demo agent and its released version (demo/planner: no deltas)
    page.select_option("#pg-agent", str(w.agent.pk))
    page.select_option("#pg-version", str(w.version.pk))
    # when the operator sends a message
    page.fill("#pg-input", "where is order O202411280001?")
    page.click("#pg-send")
    page.wait_for_selector("#pg-answer[data-state='final']", timeout=30_000)
    # then the steps appeared (a model call, a tool call, the finish) and the final answer is the stored output
    run = Run.objects.get(pk=page.get_attribute("#pg-run", "data-run"))
    assert run.playground and run.version_id == w.version.pk and run.created_by_id == w.operator.pk
    assert page.inner_text("#pg-answer").strip() == run.output.strip() and run.output
    assert page.locator("#pg-steps li[data-kind='model']").count() >= 1
    assert page.locator("#pg-steps li[data-kind='tool']").count() >= 1
    assert page.locator("#pg-steps li[data-kind='run']").count() == 1
    assert "finished" in page.inner_text("#pg-status")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "playground.png"), full_page=True)
    # and the trace link opens the run's full trace
    page.click("#pg-trace")
    page.wait_for_url(f"{live_stack.base_url}/console/runs/{run.pk}/")
    page.wait_for_selector("#trace[data-finished='true']", state="attached")
    assert page.locator("#spans [data-type='run.finished']").count() == 1
    assert not page.js_errors, page.js_errors


def test_an_unreleased_version_streams_its_answer_before_it_is_final(
    page: Any, live_stack: LiveStack, world: tuple[World, AgentVersion], fake: FakeOpenAI, unblocked_db: None
) -> None:
    w, v2 = world
    # given version 2 (not the released one) on a provider that streams a long reply slowly (about 2 s)
    fake.script(text(WORDS, pieces=40, chunk_delay=0.05, delay=0.5), replace=True)  # late: the page joins after creating
    open_playground(page, live_stack, w.operator.username)
    page.select_option("#pg-agent", str(w.agent.pk))
    page.select_option("#pg-version", str(v2.pk))
    page.fill("#pg-input", "say the words")
    page.click("#pg-send")
    # then the answer grows from deltas while the model writes, before the run's final event
    page.wait_for_selector("#pg-answer[data-state='streaming']", timeout=30_000)
    partial = page.inner_text("#pg-answer")
    assert partial and len(partial) < len(WORDS) and WORDS.startswith(partial.strip())
    assert page.get_attribute("#pg-answer", "data-state") == "streaming"
    page.wait_for_selector("#pg-answer[data-state='final']", timeout=30_000)
    assert page.inner_text("#pg-answer").strip() == WORDS
    assert int(page.get_attribute("#pg-answer", "data-deltas") or 0) >= 5
    run = Run.objects.get(pk=page.get_attribute("#pg-run", "data-run"))
    assert run.playground and run.version_id == v2.pk != w.agent.current_version_id
    assert not RunEvent.objects.filter(run=run, type="message.delta").exists()
    assert not page.js_errors, page.js_errors


def test_a_viewer_has_no_playground(page: Any, live_stack: LiveStack, world: tuple[World, AgentVersion],
                                    unblocked_db: None) -> None:
    w, _ = world
    page.goto(f"{live_stack.base_url}/accounts/login/")
    page.fill("#id_username", w.viewer.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_stack.base_url}/console/runs/")
    assert page.locator("nav.nav >> text=Playground").count() == 0
    assert page.goto(f"{live_stack.base_url}/console/playground/").status == 403


def test_an_approval_waiting_shows_with_a_link_to_its_approval_page(
    page: Any, live_stack: LiveStack, django_db_blocker: Any, target: str, unblocked_db: None  # noqa: F811
) -> None:
    # given an agent whose refund tool needs a person's approval
    desk = Desk(make_world(), target)
    w = desk.world
    open_playground(page, live_stack, w.operator.username)
    page.select_option("#pg-agent", str(w.agent.pk))
    page.fill("#pg-input", "please refund order O202411280001")
    page.click("#pg-send")
    # then the step waiting for approval appears, linking to the request's approval page
    link = page.wait_for_selector("#pg-steps li[data-kind='approval'] a.approval-link", timeout=30_000)
    run = Run.objects.get(pk=page.get_attribute("#pg-run", "data-run"))
    approval = ApprovalRequest.objects.get(run_id=run.pk)
    assert link.get_attribute("href") == f"/approvals/{approval.pk}/"
    page.wait_for_selector("#pg-status[data-state='waiting']")
    assert run.playground
    link.click()
    page.wait_for_url(f"{live_stack.base_url}/approvals/{approval.pk}/")
    assert not page.js_errors, page.js_errors
