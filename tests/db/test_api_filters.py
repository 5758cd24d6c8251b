"""Issue #12: the API's query-parameter filters are django-filter FilterSets (core/filters.py + each app's).

A bad value is a 400 naming the parameter and saying what is expected (a ``%`` in it included: django-filter
formats its messages), filters run on the tenant-scoped rows only, and the OpenAPI schema lists them.
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from audit.models import ConfigChange
from tenants.scoping import actor_for_user
from tests.factories import make_world
from tools.models import Tool
from tools.services import set_tool_enabled

pytestmark = pytest.mark.django_db


def client_for(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.mark.parametrize(("path", "param", "value", "expected"), [
    ("/api/v1/tools", "kind", "ftp", "Must be one of python, http, mcp, agent; got 'ftp'."),
    ("/api/v1/tools", "enabled", "maybe", "Must be true or false; got 'maybe'."),
    ("/api/v1/approvals", "status", "%s%(x)s", "Must be one of pending, approved, rejected, expired, cancelled; got '%s%(x)s'."),
    ("/api/v1/runs", "needs_attention", "50%", "Must be true or false; got '50%'."),
    ("/api/v1/sessions", "erased", "perhaps", "Must be true or false; got 'perhaps'."),
    ("/api/v1/audit/tool-calls", "run", "not-a-uuid", "Must be a run id (a UUID); got 'not-a-uuid'."),
    ("/api/v1/audit/tool-calls", "status", "fine", "Must be one of"),
    ("/api/v1/audit/changes", "since", "2020-13-45", "Must be an ISO date-time"),
    ("/api/v1/audit/changes", "until", "yesterday", "Must be an ISO date-time"),
    ("/api/v1/audit/changes", "since", "0001-01-01T00:00+05:00", "Out of range"),
])
def test_a_bad_filter_value_is_a_400_naming_the_parameter(path: str, param: str, value: str, expected: str) -> None:
    world = make_world()
    response = client_for(world.raw_key).get(path, {param: value})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body[param][0].startswith(expected), body
    assert body["error"]["field"] == param and body["error"]["code"] == "invalid"


def test_filters_narrow_the_tenants_own_rows_and_never_reach_another_tenants() -> None:
    mine, theirs = make_world(), make_world()
    tool = Tool.objects.get(tenant=mine.tenant, name="query_order")
    set_tool_enabled(tool=tool, enabled=False, actor=actor_for_user(mine.operator))
    set_tool_enabled(tool=Tool.objects.get(tenant=theirs.tenant, name="query_order"), enabled=False,
                     actor=actor_for_user(theirs.operator))
    api = client_for(mine.raw_key)
    off = api.get("/api/v1/tools", {"enabled": "false"}).json()
    assert [(t["name"]) for t in off["results"]] == ["query_order"]
    assert api.get("/api/v1/tools", {"enabled": "true", "kind": "python"}).json()["results"]
    changes = api.get("/api/v1/audit/changes", {"action": "tool.", "actor": theirs.operator.username}).json()["results"]
    assert changes == []  # their operator's rows are theirs, filter or not
    mine_only = api.get("/api/v1/audit/changes", {"action": "tool.disabled"}).json()["results"]
    assert [c["target_id"] for c in mine_only] == [str(tool.pk)]
    assert ConfigChange.objects.filter(action="tool.disabled").count() == 2
    today = api.get("/api/v1/audit/changes", {"since": "2000-01-01", "until": "9999-12-31"}).json()["results"]
    assert today and all(c["tenant"] == mine.tenant.slug for c in today)


def _parameters(schema: dict[str, Any], path: str) -> set[str]:
    return {p["name"] for p in schema["paths"][path]["get"].get("parameters", []) if p["in"] == "query"}


def test_the_openapi_schema_lists_the_filters() -> None:
    world = make_world()
    schema = client_for(world.raw_key).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert {"kind", "enabled"} <= _parameters(schema, "/api/v1/tools")
    assert {"status"} <= _parameters(schema, "/api/v1/approvals")
    assert {"needs_attention"} <= _parameters(schema, "/api/v1/runs")
    assert {"agent", "erased"} <= _parameters(schema, "/api/v1/sessions")
    assert {"run", "session", "tool", "status", "agent", "since", "until", "limit"} <= _parameters(schema, "/api/v1/audit/tool-calls")
    assert {"action", "target_type", "target_id", "actor", "since", "until"} <= _parameters(schema, "/api/v1/audit/changes")


def test_list_filters_never_narrow_one_object_or_an_action_on_it() -> None:
    from tests.e2e.builders import make_run

    world = make_world()
    run = make_run(world)  # finished, needs no attention
    api = client_for(world.raw_key)
    assert api.get(f"/api/v1/runs/{run.pk}", {"needs_attention": "true"}).status_code == 200
    assert api.get(f"/api/v1/runs/{run.pk}/events", {"needs_attention": "true"}).status_code == 200
    assert api.get("/api/v1/tools/query_order", {"enabled": "false"}).status_code == 200


@pytest.mark.parametrize(("query", "message"), [
    ({"agent": "²"}, "agent must be a number (an id); got &#x27;²&#x27;."),
    ({"user": "99999999999999999999"}, "user must be a number (an id)"),
    ({"day": "9999-12-31"}, "day must be a date before 9999-12-31"),
    ({"since": "2024-02-30"}, "since must be a date as YYYY-MM-DD"),
    ({"status": "50%"}, "status must be one of"),
])
def test_the_console_ignores_a_bad_filter_with_a_message_and_never_fails(query: dict[str, str], message: str) -> None:
    from django.test import Client

    world = make_world()
    client = Client()
    client.force_login(world.operator)
    page = client.get("/console/runs/", query)
    assert page.status_code == 200
    assert message in page.content.decode() and "The filter was ignored." in page.content.decode()
