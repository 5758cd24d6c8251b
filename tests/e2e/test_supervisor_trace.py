"""A supervisor run's trace in Chromium: the route, why it was chosen, and a link to the child run's trace."""

from __future__ import annotations

from typing import Any

import pytest

from agents.models import Agent, AgentVersion
from tests.e2e.test_console_browser import log_in, wait_finished
from tests.factories import World, make_world

pytestmark = [pytest.mark.integration, pytest.mark.browser]


@pytest.fixture(scope="module")
def world(live_stack: Any, django_db_blocker: Any) -> World:
    with django_db_blocker.unblock():
        world = make_world()
        agent = Agent.objects.create(tenant=world.tenant, slug="desk", name="Desk")
        supervisor = {"sub_agents": [{"agent": "order-assistant", "description": "Orders"}],
                      "rules": [{"agent": "order-assistant", "regex": r"O\d{12}"}]}
        version = AgentVersion(tenant=world.tenant, agent=agent, number=1, model="demo/planner", tools=[],
                               policy={"supervisor": supervisor})
        version.full_clean()
        version.save()
        agent.current_version = version
        agent.save(update_fields=["current_version"])
        return world


def test_the_trace_shows_the_route_and_links_the_child_run(page: Any, live_stack: Any, world: World) -> None:
    with live_stack.client(world.raw_key) as http:
        run_id = http.post("/api/v1/runs", json={"agent": "desk", "input": "where is order O202411280001?"}).json()["id"]
    live_stack.wait_for_run(world.raw_key, run_id)
    log_in(page, live_stack, world.operator.username)
    page.goto(f"{live_stack.base_url}/console/runs/{run_id}/")
    wait_finished(page)
    route = page.locator("#spans li[data-type='supervisor.route']")
    assert "route → order-assistant" in route.inner_text()
    assert "O202411280001" in route.inner_text(), "what the rule matched is shown"
    link = page.locator("#spans li[data-type='supervisor.child_finished'] a")
    link.click()
    page.wait_for_url(f"{live_stack.base_url}/console/runs/*/")
    assert run_id not in page.url
    wait_finished(page)
    assert page.locator("#spans li[data-type='tool.call']").count() >= 1, "the child's own trace, with its tool calls"
