"""Issue #12: typed documents. The policy's one model is what the service checks, the OpenAPI schema documents
and the admin editor lists; a value the schema refuses is refused by the service at the same path."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runtime.config import DEFAULT_POLICY, check_policy
from runtime.documents import field_rows, json_schema
from runtime.policy_document import Policy
from tests.factories import make_user, make_world

pytestmark = pytest.mark.django_db


def _walk(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    node = schema
    for key in path:
        node = node["properties"][key]
    return node


def test_the_openapi_schema_documents_the_policy_for_reads_and_writes() -> None:
    world = make_world()
    schema = Client().get("/api/schema/", headers={"Accept": "application/json", "Authorization": f"Bearer {world.raw_key}"}).json()
    components = schema["components"]["schemas"]
    for component in ("AgentVersion", "AgentVersionWrite"):
        policy = components[component]["properties"]["policy"]
        run_limit = _walk(policy, "limits", "model_calls", "run_limit")
        assert run_limit == {"type": "integer", "minimum": 1, "default": 8, "title": "Run Limit", "nullable": True}, component
        assert _walk(policy, "budgets", "run", "cost")["exclusiveMinimum"] is True  # OpenAPI 3.0's dialect
        assert _walk(policy, "limits", "tiers", "scope")["enum"] == ["run", "session"]
        assert policy["additionalProperties"] is False
        assert "$ref" not in str(policy)


def test_the_admin_editor_lists_every_field_with_what_it_takes_and_its_default() -> None:
    world = make_world()
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    page = client.get(f"/admin/agents/agentversion/{world.version.pk}/change/").content.decode()
    assert 'data-document="Policy"' in page
    for path, _takes, _default in field_rows(json_schema(Policy)):
        assert f"<code>{path}</code>" in page, path
    assert "integer &gt;= 2 or null" in page  # loop_detection.max_repeats
    assert "&quot;max_recursion&quot;: 10" in page  # the stored document, pretty-printed in the editor


def test_the_tool_admin_edits_the_approval_policy_with_its_fields_listed() -> None:
    world = make_world()
    client = Client()
    client.force_login(make_user(is_staff=True, is_superuser=True))
    tool = world.tenant.tool_set.first() if hasattr(world.tenant, "tool_set") else None
    url = f"/admin/tools/tool/{tool.pk}/change/" if tool else "/admin/tools/tool/add/"
    page = client.get(url).content.decode()
    assert 'data-document="ApprovalPolicy"' in page
    for path in ("mode", "expires_in_seconds", "approver_roles", "four_eyes"):
        assert f"<code>{path}</code>" in page
    assert "integer from 10 to 2592000" in page


def _wrong_value(takes: str) -> Any:
    if takes.startswith(("integer", "number")):
        return "many"
    if takes == "boolean":
        return "yes"
    if takes.startswith("one of"):
        return "none-of-these"
    if takes.startswith("list"):
        return "not a list"
    if takes == "object":
        return ["not", "an", "object"]
    return 12345


@pytest.mark.parametrize("path,takes", [(p, t) for p, t, _ in field_rows(json_schema(Policy))])
def test_a_value_the_schema_refuses_is_refused_by_the_checker_at_that_path(path: str, takes: str) -> None:
    document: dict[str, Any] = {}
    node = document
    keys = path.split(".")
    if keys[:2] == ["model", "task_models"]:  # an object of task -> model: the task is a key of the object
        keys = keys[:2]
        node.setdefault("model", {})["task_models"] = {path.split(".")[2]: 12345}
    else:
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = _wrong_value(takes)
    errors = check_policy(document)
    assert errors and all(e.startswith(path) for e in errors), (path, takes, errors)


def test_the_defaults_live_in_the_model() -> None:
    assert Policy().to_json() == DEFAULT_POLICY
    assert [d for p, _, d in field_rows(json_schema(Policy)) if p == "budgets.run.wall_seconds"] == [300]


def test_every_stored_document_parses_back_to_itself() -> None:
    from runtime.approval_policy import ApprovalOverride, ApprovalPolicy
    from runtime.documents import parse

    for model in (Policy, ApprovalPolicy, ApprovalOverride):
        stored = model().to_json()
        assert parse(model, stored).to_json() == stored, model.__name__
