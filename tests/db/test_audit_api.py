"""The audit trail over the API: newest first, in cursor pages, filtered, and only the actor's tenants."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from agents import services
from audit.models import ConfigChange, ToolCallAudit
from tenants.scoping import Actor, actor_for_api_key, actor_for_user
from tests.factories import World, make_world
from tests.support.clients import bearer_client
from tools.services import set_tool_enabled

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(microsecond=0)


@pytest.fixture
def api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _calls(world: World) -> tuple[Any, Any]:
    """Two runs; five calls an hour apart, the newest last."""
    first = services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="a")
    second = services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="b")
    rows = [(first, "query_order", "ok"), (first, "query_logistics", "error"), (second, "query_order", "invalid"),
            (second, "query_order", "ok"), (second, "sum_order_totals", "denied")]
    for i, (run, tool, status) in enumerate(rows):
        ToolCallAudit.objects.create(tenant=world.tenant, run=run, agent=world.agent, version=world.version, session=run.session,
                                     user=world.operator, api_key=world.key, step=1, call_id=f"c{i}", tool_name=tool,
                                     status=status, arguments_summary='{"order_id": "O2024…"}',
                                     created_at=NOW - dt.timedelta(hours=len(rows) - i))
    return first, second


def _ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [r["call_id"] for r in response.json()["results"]]


def test_tool_calls_come_newest_first_in_cursor_pages(world: World, api: APIClient) -> None:
    _calls(world)
    page = api.get("/api/v1/audit/tool-calls?limit=2")
    assert _ids(page) == ["c4", "c3"]
    row = page.json()["results"][0]
    assert (row["tool_name"], row["status"], row["agent"], row["version"], row["user"], row["api_key"]) == (
        "sum_order_totals", "denied", "order-assistant", 1, world.operator.username, world.key.prefix)
    seen = _ids(page)
    url = page.json()["next"]
    while url:
        page = api.get(url)
        seen += _ids(page)
        url = page.json()["next"]
    assert seen == ["c4", "c3", "c2", "c1", "c0"], "every row once, no gap, no duplicate"
    one = api.get(f"/api/v1/audit/tool-calls/{row['id']}")
    assert one.status_code == 200 and one.json()["call_id"] == "c4"


def test_tool_calls_are_filtered_by_run_tool_status_agent_and_time(world: World, api: APIClient) -> None:
    first, second = _calls(world)
    assert _ids(api.get(f"/api/v1/audit/tool-calls?run={first.pk}")) == ["c1", "c0"]
    assert _ids(api.get("/api/v1/audit/tool-calls?tool=query_order")) == ["c3", "c2", "c0"]
    assert _ids(api.get(f"/api/v1/audit/tool-calls?tool=query_order&status=ok&run={second.pk}")) == ["c3"]
    assert _ids(api.get("/api/v1/audit/tool-calls?agent=order-assistant")) == ["c4", "c3", "c2", "c1", "c0"]
    assert _ids(api.get("/api/v1/audit/tool-calls?agent=someone-else")) == []
    since = (NOW - dt.timedelta(hours=3)).isoformat()
    until = (NOW - dt.timedelta(hours=2)).isoformat()
    assert _ids(api.get("/api/v1/audit/tool-calls", {"since": since, "until": until})) == ["c3", "c2"]
    assert _ids(api.get("/api/v1/audit/tool-calls", {"since": (NOW + dt.timedelta(days=1)).date().isoformat()})) == []


@pytest.mark.parametrize(("param", "value"), [("status", "fine"), ("run", "not-a-uuid"), ("since", "yesterday")])
def test_a_bad_filter_is_a_400_naming_it(world: World, api: APIClient, param: str, value: str) -> None:
    response = api.get("/api/v1/audit/tool-calls", {param: value})
    assert response.status_code == 400 and param in response.json(), response.content


def test_other_tenants_audit_is_invisible_and_nothing_can_be_written(world: World, api: APIClient) -> None:
    _calls(world)
    outsider = make_world()
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION=f"Bearer {outsider.raw_key}")
    assert _ids(stranger.get("/api/v1/audit/tool-calls")) == []
    mine = ToolCallAudit.objects.filter(tenant=world.tenant).first()
    assert stranger.get(f"/api/v1/audit/tool-calls/{mine.pk}").status_code == 404
    mine_change = ConfigChange.objects.filter(tenant=world.tenant).first()
    assert stranger.get(f"/api/v1/audit/changes/{mine_change.pk}").status_code == 404
    assert all(c["tenant"] == outsider.tenant.slug for c in stranger.get("/api/v1/audit/changes").json()["results"])
    viewer = APIClient()
    viewer.force_authenticate(world.viewer)
    assert len(_ids(viewer.get("/api/v1/audit/tool-calls"))) == 5
    assert viewer.post("/api/v1/audit/tool-calls", {}, format="json").status_code == 405
    assert api.delete(f"/api/v1/audit/tool-calls/{mine.pk}").status_code == 405
    assert APIClient().get("/api/v1/audit/changes").status_code in (401, 403)


def test_config_changes_newest_first_filtered_by_action_actor_and_target(world: World, api: APIClient) -> None:
    from tools.models import Tool

    tool = Tool.objects.get(tenant=world.tenant, name="query_order")
    set_tool_enabled(tool=tool, enabled=False, actor=actor_for_user(world.operator))
    set_tool_enabled(tool=tool, enabled=True, actor=Actor(user=world.viewer, roles={world.tenant.pk: "operator"}))
    everything = api.get("/api/v1/audit/changes").json()["results"]
    assert [c["action"] for c in everything[:2]] == ["tool.enabled", "tool.disabled"]
    family = [c["action"] for c in api.get("/api/v1/audit/changes?action=tool.").json()["results"]]
    assert family[:2] == ["tool.enabled", "tool.disabled"] and all(a.startswith("tool.") for a in family)
    by_viewer = api.get("/api/v1/audit/changes", {"actor": world.viewer.username}).json()["results"]
    assert [(c["action"], c["actor"], c["target_repr"]) for c in by_viewer] == [("tool.enabled", world.viewer.username, "query_order")]
    targeted = api.get("/api/v1/audit/changes", {"target_type": "Tool", "target_id": str(tool.pk)}).json()["results"]
    assert [c["action"] for c in targeted] == ["tool.enabled", "tool.disabled", "tool.created"]
    page = api.get("/api/v1/audit/changes?limit=1").json()
    assert len(page["results"]) == 1 and page["next"]
