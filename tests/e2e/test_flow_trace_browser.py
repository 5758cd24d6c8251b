"""A flow run's trace in Chromium: a node turns from running to succeeded in the graph and the lanes, live.

The nodes call the slow test tools (tests/support/slow_tools.py, 2 s a call): ``ticket`` first, then ``confirm`` and
``again`` side by side, so the page sees nodes running and finishing without a reload, in two lanes.
"""

from __future__ import annotations

from typing import Any

import pytest

import tests.support.slow_tools as slow_tools
from tests.e2e.test_console_browser import log_in, wait_finished
from tests.factories import World, make_world
from tools.services import install_python_tool

pytestmark = [pytest.mark.integration, pytest.mark.browser]

ORDER = "O202411280001"
FLOW = {"nodes": [
    {"id": "ticket", "kind": "tool", "tool": "slow_fetch", "inputs": {"order_id": "input.order_id"}, "timeout_seconds": 5},
    {"id": "confirm", "kind": "tool", "tool": "slow_confirm", "after": ["ticket"], "timeout_seconds": 5,
     "inputs": {"ticket": "nodes.ticket.ticket"}},
    {"id": "again", "kind": "tool", "tool": "slow_fetch", "after": ["ticket"], "timeout_seconds": 5,
     "inputs": {"order_id": "input.order_id"}},
]}

STATE = "id => { const g = [...document.querySelectorAll('#flow-graph .flow-node')].find(n => n.dataset.node === id);" \
        " return g ? g.dataset.state : null; }"
FILL = "id => { const g = [...document.querySelectorAll('#flow-graph .flow-node')].find(n => n.dataset.node === id);" \
       " return getComputedStyle(g.querySelector('rect')).fill; }"


@pytest.fixture(scope="module")
def world(live_stack: Any, django_db_blocker: Any) -> World:
    with django_db_blocker.unblock():
        world = make_world()
        for key in slow_tools.SLOW_TOOL_KEYS:
            install_python_tool(tenant=world.tenant, key=key, actor=None)
    with live_stack.client(world.raw_key) as http:
        assert http.post("/api/v1/flows", json={"slug": "slow", "name": "Slow"}).status_code == 201
        saved = http.post("/api/v1/flows/slow/versions", json={"model": "demo/planner", "definition": FLOW,
                                                                "make_current": True})
        assert saved.status_code == 201, saved.text
    return world


def test_a_running_nodes_colour_turns_to_succeeded_live(page: Any, live_stack: Any, world: World) -> None:
    log_in(page, live_stack, world.operator.username)
    with live_stack.client(world.raw_key) as http:
        answer = http.post("/api/v1/runs", json={"flow": "slow", "input": {"order_id": ORDER}})
    assert answer.status_code == 202, answer.text
    run_id = answer.json()["id"]
    page.goto(f"{live_stack.base_url}/console/runs/{run_id}/")
    page.evaluate("window.__samePage = true")
    # Whichever node runs when we look (the page may open after the first one ended): watch it finish.
    # (selectors, not wait_for_function: the page's CSP forbids the eval it needs)
    page.wait_for_selector("#flow-graph .flow-node[data-state='running']", state="attached", timeout=15_000)
    node = page.evaluate("[...document.querySelectorAll('#flow-graph .flow-node')]"
                         ".find(n => n.dataset.state === 'running').dataset.node")
    running_fill = page.evaluate(FILL, node)
    page.wait_for_selector(f"#flow-graph .flow-node[data-node='{node}'][data-state='succeeded']", state="attached",
                           timeout=15_000)
    assert page.evaluate(FILL, node) != running_fill, "the node's colour changed"
    assert running_fill == "rgb(147, 197, 253)" and page.evaluate(FILL, node) == "rgb(134, 239, 172)"
    span = page.locator("#flow-lanes .flow-span", has_text=f"{node} · tool")
    assert span.get_attribute("data-state") == "succeeded" and "succeeded" in (span.text_content() or "")
    wait_finished(page)
    assert page.evaluate("window.__samePage") is True, "no reload: the page followed the websocket"
    states = {n: page.evaluate(STATE, n) for n in ("ticket", "confirm", "again")}
    assert states == {"ticket": "succeeded", "confirm": "succeeded", "again": "succeeded"}
    lanes = {n: page.locator("#flow-lanes .flow-span", has_text=f"{n} · tool").get_attribute("data-lane")
             for n in ("ticket", "confirm", "again")}
    assert lanes["ticket"] == "0" and {lanes["confirm"], lanes["again"]} == {"0", "1"}, lanes
    href = page.locator("#flow-lanes .flow-span", has_text="confirm · tool").get_attribute("href")
    assert page.locator(href).count() == 1, "a span links to the node's events in the trace"
    assert page.js_errors == []


def _waiting_run(live_stack: Any, world: World, slug: str) -> str:
    """A run of a flow whose first node is an approval, waiting for it."""
    gated = {"nodes": [
        {"id": "check", "kind": "approval", "preview": "Go on with {input.order_id}?"},
        {"id": "order", "kind": "tool", "tool": "query_order", "after": ["check"], "inputs": {"order_id": "input.order_id"}},
    ]}
    with live_stack.client(world.raw_key) as http:
        assert http.post("/api/v1/flows", json={"slug": slug, "name": slug}).status_code == 201
        assert http.post(f"/api/v1/flows/{slug}/versions", json={"model": "demo/planner", "definition": gated,
                                                                  "make_current": True}).status_code == 201
        run_id = str(http.post("/api/v1/runs", json={"flow": slug, "input": {"order_id": ORDER}}).json()["id"])
    assert live_stack.wait_for_run(world.raw_key, run_id, timeout=30, statuses=("waiting", "finished"))["status"] == "waiting"
    return run_id


def _approve(live_stack: Any, world: World, run_id: str, django_db_blocker: Any, note: str) -> None:
    from accounts import services as tenant_services
    from approvals.models import ApprovalRequest
    from tenants.models import Role
    from tests.factories import make_user

    with django_db_blocker.unblock():
        request = ApprovalRequest.objects.get(run_id=run_id)
        approver = make_user()
        tenant_services.set_membership(tenant=world.tenant, user=approver, role=Role.APPROVER, actor=None)
        _key, raw = tenant_services.create_api_key(tenant=world.tenant, name="approver", owner=approver,
                                                   role=Role.APPROVER, actor=None)
    with live_stack.client(raw) as http:
        decided = http.post(f"/api/v1/approvals/{request.pk}/approve", json={"note": note})
    assert decided.status_code == 200, decided.text


def test_an_approval_node_waits_then_succeeds_live_and_a_hostile_note_stays_text(
    page: Any, live_stack: Any, world: World, django_db_blocker: Any
) -> None:
    run_id = _waiting_run(live_stack, world, "gated")
    log_in(page, live_stack, world.operator.username)
    page.goto(f"{live_stack.base_url}/console/runs/{run_id}/")
    page.wait_for_selector("#flow-graph .flow-node[data-node='check'][data-state='waiting']", state="attached")
    assert page.locator("#flow-graph .flow-node[data-node='order']").get_attribute("data-state") == "pending"
    page.evaluate("window.__samePage = true")
    _approve(live_stack, world, run_id, django_db_blocker, note="<script>window.__xss=1</script>")
    page.wait_for_selector("#flow-graph .flow-node[data-node='check'][data-state='succeeded']", state="attached",
                           timeout=20_000)
    page.wait_for_selector("#flow-graph .flow-node[data-node='order'][data-state='succeeded']", state="attached",
                           timeout=20_000)
    wait_finished(page)
    assert page.evaluate("window.__samePage") is True, "no reload"
    assert page.evaluate("window.__xss === undefined"), "the approver's note never ran as script"
    assert page.locator("#flow script, #trace script").count() == 0
    assert "<script>window.__xss=1</script>" in (page.locator("#spans").text_content() or ""), "shown as text"
    assert page.js_errors == []


def test_after_a_dropped_socket_the_graph_catches_up_from_after(
    page: Any, live_stack: Any, world: World, django_db_blocker: Any
) -> None:
    from tests.e2e.test_runs_resync import CUTTABLE_SOCKETS, _closed_port

    run_id = _waiting_run(live_stack, world, "gated-resync")
    page.add_init_script(CUTTABLE_SOCKETS.replace("CLOSED_PORT", str(_closed_port())))
    log_in(page, live_stack, world.operator.username)
    page.goto(f"{live_stack.base_url}/console/runs/{run_id}/")
    page.wait_for_selector("#live-status[data-state=live]")
    page.evaluate("window.__samePage = true; window.__blockSockets = true; window.__sockets.forEach(s => s.close())")
    page.wait_for_selector("#live-status[data-state=reconnecting]", timeout=15_000)
    # the flow goes on and ends while the page is cut off: it still shows the wait
    _approve(live_stack, world, run_id, django_db_blocker, note="fine")
    live_stack.wait_for_run(world.raw_key, run_id, timeout=30)
    assert page.locator("#flow-graph .flow-node[data-node='check']").get_attribute("data-state") == "waiting"
    page.evaluate("window.__blockSockets = false")
    page.wait_for_selector("#flow-graph .flow-node[data-node='order'][data-state='succeeded']", state="attached",
                           timeout=20_000)
    assert page.locator("#flow-graph .flow-node[data-node='check']").get_attribute("data-state") == "succeeded"
    assert page.locator("#flow-lanes .flow-span[data-state='succeeded']").count() == 2
    assert page.evaluate("window.__samePage") is True, "caught up without a reload"
    assert page.js_errors == []
