"""Release safety in Chromium (issue #16): an operator picks runs from the runs list into an evaluation set, replays it
on a changed candidate version on the real worker, watches the progress, and reads the diff page.

The session's live stack (its real worker runs the replay shards); runs are made over the API by the demo planner.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from agents.models import AgentVersion
from releases.models import EvaluationSet, ReplayBatch, ReplayRun
from tests.e2e.conftest import SCREENSHOTS
from tests.e2e.test_console_browser import log_in
from tests.factories import World, make_world

pytestmark = [pytest.mark.integration, pytest.mark.browser]

QUESTIONS = ["Where is my order O202411280001?", "What is in order O202411280002?", "Hello, who are you?"]


@pytest.fixture(scope="module")
def world(live_stack: Any, django_db_blocker: Any) -> tuple[World, AgentVersion]:
    """Three finished runs of the demo agent's v1, and a v2 without the logistics tool (its answers change)."""
    with django_db_blocker.unblock():
        world = make_world()
        lean = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model=world.version.model,
                                           system_prompt=world.version.system_prompt,
                                           tools=[t for t in world.version.tools if t != "query_logistics"],
                                           policy=world.version.policy, note="without logistics")
    with live_stack.client(world.raw_key) as http:
        ids = []
        for question in QUESTIONS:
            started = http.post("/api/v1/runs", json={"agent": world.agent.slug, "input": question})
            assert started.status_code == 202, started.text
            ids.append(started.json()["id"])
    for run_id in ids:
        live_stack.wait_for_run(world.raw_key, run_id)
    return world, lean


def test_create_a_set_from_the_runs_list_replay_it_and_read_the_diff_page(
    page: Any, live_stack: Any, world: tuple[World, AgentVersion], unblocked_db: None
) -> None:
    w, lean = world
    log_in(page, live_stack, w.operator.username)
    # the runs list, filtered to the agent, offers its page of runs as a new evaluation set
    page.goto(f"{live_stack.base_url}/console/runs/?agent={w.agent.pk}")
    page.click("#make-set")
    page.wait_for_url(re.compile(r".*/console/evaluation-sets/\?.*"))
    picked = page.input_value("#set-runs").split()
    assert len(picked) == 3
    page.fill("#set-name", "browser golden set")
    page.click("#set-create")
    page.wait_for_url(re.compile(r".*/console/evaluation-sets/\d+/$"))
    row = EvaluationSet.objects.get(tenant=w.tenant, name="browser golden set")
    assert row.members.count() == 3
    assert page.locator("#members tbody tr").count() == 3

    # replay it on v2 in live mode (the demo planner: no model cost), comparing the tools each run calls
    page.select_option("#replay-candidate", str(lean.pk))
    page.select_option("#replay-mode", "live")
    page.fill("input[name=cost_cap]", "1.00")
    page.check("input[name=check][value=same_tools]")
    page.click("#replay-start")
    page.wait_for_url(re.compile(r".*/console/replays/\d+/$"))
    batch = ReplayBatch.objects.get(evaluation_set=row)
    # the page polls the progress and reloads itself with the results when the worker is done
    page.wait_for_selector('#progress[data-running="false"]', timeout=60_000)
    batch.refresh_from_db()
    assert batch.status == "finished" and batch.done == 3, (batch.status, batch.error, live_stack.logdir)
    assert page.text_content("#batch-status") == "finished"
    sections = page.locator("section.replay-result")
    assert sections.count() == 3
    regressions = ReplayRun.objects.filter(batch=batch, regression=True).count()
    assert regressions >= 1, "dropping the logistics tool changes the order question's tools"
    first = sections.nth(0)
    assert "regression" in (first.get_attribute("class") or ""), "regressions are listed first"
    assert "Tool calls ≠" in first.locator("tr.changed").first.text_content()
    assert "query_logistics(" in first.inner_text()
    rate = page.text_content("#batch-pass-rate")
    assert rate is not None and rate.strip() == f"{round(batch.pass_rate * 100)} %"
    assert page.js_errors == []
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "replay-diff.png"), full_page=True)

    # a second tenant's operator gets a 404 for the same pages
    other = make_world()
    page.context.clear_cookies()
    log_in(page, live_stack, other.operator.username)
    response = page.goto(f"{live_stack.base_url}/console/replays/{batch.pk}/")
    assert response is not None and response.status == 404
