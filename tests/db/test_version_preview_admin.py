"""Issue #16 item 4's leftover: the "Preview impact" button on the agent version (and flow version) admin change form.

It replays the calls the version's runs made under the form's unsaved tool list / policy (agents.shadow), saves
nothing, needs the CSRF token, refuses bad input naming the field, and a foreign tenant's version is a 404.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agents import services as run_services
from agents.models import AgentVersion
from audit.masking import summarize_arguments
from audit.models import ConfigChange, ToolCallAudit
from tenants.scoping import actor_for_api_key
from tests.db.test_flow_runs import make_flow
from tests.factories import World, csrf_client, make_world

pytestmark = pytest.mark.django_db

TOOL = "query_order"


def _seed_calls(world: World, n: int = 3) -> Any:
    run = run_services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="where is my order")
    for i in range(n):
        ToolCallAudit.objects.create(
            tenant=world.tenant, run=run, agent_id=run.agent_id, version_id=run.version_id, session_id=run.session_id,
            step=1, call_id=f"c-{i}", tool_name=TOOL, arguments_summary=summarize_arguments({"order_id": "O1"}, ()),
            status="ok", created_at=timezone.now() - timedelta(minutes=10 - i))
    return run


def _url(version: AgentVersion, kind: str = "agentversion") -> str:
    return f"/admin/agents/{kind}/{version.pk}/change/"


def test_a_used_versions_form_previews_a_proposed_tool_list_with_csrf_and_saves_nothing(world: World) -> None:
    _seed_calls(world)
    client = csrf_client(world.operator)
    page = client.get(_url(world.version))
    assert page.status_code == 200
    html = page.content.decode()
    # a used version is read-only: the button's box holds the proposal, prefilled with the current values
    assert 'name="_preview_impact"' in html and 'name="tools"' in html and 'name="policy"' in html
    changes_before = ConfigChange.objects.count()
    tools = [t for t in world.version.tools if t != TOOL]
    data = {"tools": json.dumps(tools), "policy": json.dumps(world.version.policy), "_preview_impact": "1",
            "_preview_days": "7"}
    assert client.post(_url(world.version), data).status_code == 403  # no CSRF token
    data["csrfmiddlewaretoken"] = page.context["csrf_token"]
    response = client.post(_url(world.version), data)
    assert response.status_code == 200, response.content[:2000]
    html = response.content.decode()
    assert 'id="impact"' in html and "Changed: tools." in html, html[html.find("<h1>"):][:1500]
    assert re.search(r'class="impact-newly-denied"><td>Newly denied</td><td>3</td>', html)
    assert re.search(rf"{TOOL}: 3", html)
    world.version.refresh_from_db()
    assert TOOL in world.version.tools and ConfigChange.objects.count() == changes_before  # nothing saved, no audit

    policy = {**world.version.policy, "approvals": {"tools": {TOOL: {"mode": "always"}}}}
    data.update(tools=json.dumps(world.version.tools), policy=json.dumps(policy))
    response = client.post(_url(world.version), data)
    assert response.status_code == 200, response.content[:2000]
    assert re.search(r'class="impact-newly-needs-approval"><td>Newly needs approval</td><td>3</td>', response.content.decode())


def test_bad_proposals_are_a_400_naming_the_field(world: World) -> None:
    _seed_calls(world, 1)
    client = csrf_client(world.operator)
    token = client.get(_url(world.version)).context["csrf_token"]
    base = {"csrfmiddlewaretoken": token, "_preview_impact": "1", "policy": json.dumps(world.version.policy)}
    bad_json = client.post(_url(world.version), {**base, "tools": "[not json"})
    assert bad_json.status_code == 400 and "tools: Must be JSON" in bad_json.content.decode()
    unknown = client.post(_url(world.version), {**base, "tools": json.dumps(["no_such_tool"])})
    assert unknown.status_code == 400 and "tools:" in unknown.content.decode() and "no_such_tool" in unknown.content.decode()
    bad_policy = client.post(_url(world.version), {**base, "tools": json.dumps(world.version.tools),
                                                   "policy": json.dumps({"limits": {"max_recursion": "lots"}})})
    assert bad_policy.status_code == 400 and "max_recursion" in bad_policy.content.decode()
    days = client.post(_url(world.version), {**base, "tools": json.dumps(world.version.tools), "_preview_days": "99"})
    assert days.status_code == 400 and "days" in days.content.decode()


def test_an_unused_versions_form_previews_its_own_unsaved_values(world: World) -> None:
    draft = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model=world.version.model,
                                        tools=list(world.version.tools), policy=world.version.policy)
    client = csrf_client(world.operator)
    page = client.get(_url(draft))
    html = page.content.decode()
    assert 'name="_preview_impact"' in html and 'id="id_preview_tools"' not in html  # the form's own tools field
    response = client.post(_url(draft), {"csrfmiddlewaretoken": page.context["csrf_token"], "_preview_impact": "1",
                                         "tools": json.dumps([]), "policy": json.dumps(draft.policy)})
    assert response.status_code == 200 and "Changed: tools." in response.content.decode()
    draft.refresh_from_db()
    assert draft.tools == world.version.tools


def test_a_foreign_tenants_version_is_a_404(world: World) -> None:
    _seed_calls(world, 1)
    other = make_world()
    client = csrf_client(other.operator)
    token = client.get(_url(other.version)).context["csrf_token"]
    assert client.get(_url(world.version)).status_code in (302, 404)  # the admin's own answer for a foreign object
    response = client.post(_url(world.version), {"csrfmiddlewaretoken": token, "_preview_impact": "1",
                                                 "tools": json.dumps([])})
    assert response.status_code == 404


def test_a_flow_versions_form_has_the_button_for_its_policy(world: World) -> None:
    flow = make_flow(world, {"nodes": [{"id": "order", "kind": "tool", "tool": TOOL, "inputs": {"order_id": "input.order_id"}}],
                             "output": "nodes.order"})
    version = flow.current_version
    client = csrf_client(world.operator)
    page = client.get(_url(version, "flowversion"))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="_preview_impact"' in html and 'name="tools"' not in html  # a flow names its tools in its graph
    response = client.post(_url(version, "flowversion"), {"csrfmiddlewaretoken": page.context["csrf_token"],
                                                          "_preview_impact": "1", "policy": json.dumps(version.policy)})
    assert response.status_code == 200, response.content[:2000]
    assert 'id="impact"' in response.content.decode()
