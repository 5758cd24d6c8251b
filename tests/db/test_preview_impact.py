"""Issue #16 item 4: policy shadow replay ("preview impact") of a proposed, unsaved tool policy on seeded audit rows.

Hand counts over seeded ``ToolCallAudit`` rows: the kill switch, the allow-list and scopes, a new approval condition,
a rate limit replayed on the recorded timestamps, a tool switched back on; the cap; a second tenant; no write; bad
input naming the field; the API through DRF and the admin form (CSRF) showing the table.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from agents import services as run_services
from agents import shadow
from agents.models import AgentVersion
from audit.masking import summarize_arguments
from audit.models import ConfigChange, ToolCallAudit
from tenants.scoping import actor_for_api_key, actor_for_user
from tests.factories import World, make_world
from tests.support.clients import bearer_client
from tools.models import Tool
from tools.services import ToolRefused

pytestmark = pytest.mark.django_db

TOOL = "query_order"


def _api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _run(world: World, facts: dict[str, Any] | None = None) -> Any:
    return run_services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="where is my order",
                                  facts=facts)


def _seed(world: World, run: Any, *, at: Any, args: dict[str, Any] | None = None, status: str = "ok",
          tool: str = TOOL, call: str | None = None) -> ToolCallAudit:
    arguments = args if args is not None else {"order_id": "O1"}
    return ToolCallAudit.objects.create(
        tenant=world.tenant, run=run, agent_id=run.agent_id, version_id=run.version_id, session_id=run.session_id,
        step=1, call_id=call or f"c-{ToolCallAudit.objects.count()}", tool_name=tool,
        arguments_summary=summarize_arguments(arguments, ()), status=status, created_at=at)


def _preview(world: World, **fields: Any) -> dict[str, Any]:
    days = fields.pop("days", None)
    cap = fields.pop("cap", shadow.DEFAULT_CAP)
    tool = Tool.objects.get(tenant=world.tenant, name=TOOL)
    return shadow.preview_tool_change(tool=tool, actor=actor_for_api_key(world.key), fields=fields, days=days, cap=cap)


def _ago(minutes: float) -> Any:
    return timezone.now() - timedelta(minutes=minutes)


def test_the_kill_switch_denies_every_recorded_call_counted_by_tenant_agent_and_tool(world: World) -> None:
    run = _run(world)
    for i in range(7):
        _seed(world, run, at=_ago(60 - i))
    result = _preview(world, enabled=False)
    denied = result["newly_denied"]
    assert result["changed"] == ["enabled"] and result["calls_evaluated"] == 7
    assert denied["count"] == 7
    assert denied["by_tenant"] == {world.tenant.slug: 7}
    assert denied["by_agent"] == {"order-assistant": 7} and denied["by_tool"] == {TOOL: 7}
    assert len(denied["examples"]) == shadow.EXAMPLES
    assert denied["examples"][0]["reason"] == "switched off by an operator"
    assert result["newly_allowed"]["count"] == result["newly_rate_limited"]["count"] == 0


def test_switching_a_disabled_tool_back_on_is_newly_allowed(world: World) -> None:
    Tool.objects.filter(tenant=world.tenant, name=TOOL).update(enabled=False)
    run = _run(world)
    for i in range(3):
        _seed(world, run, at=_ago(30 - i), status="denied")
    result = _preview(world, enabled=True)
    assert result["newly_allowed"]["count"] == 3 and result["newly_denied"]["count"] == 0
    assert result["newly_allowed"]["examples"][0]["before"] == "denied"


def test_required_scopes_deny_only_calls_whose_conversation_lacks_them_and_the_allow_list_is_respected(world: World) -> None:
    granted, bare = _run(world, facts={"grants": ["orders:read"]}), _run(world)
    _seed(world, granted, at=_ago(10))
    _seed(world, bare, at=_ago(9))
    _seed(world, bare, at=_ago(8))
    # a version that does not list the tool: its calls were denied before and stay denied, so they are no change
    other = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner",
                                        system_prompt="x", tools=["query_logistics"], policy={})
    off_list = _run(world)
    off_list.version = other
    off_list.save(update_fields=["version"])
    _seed(world, off_list, at=_ago(7))
    result = _preview(world, required_scopes=["orders:read"])
    assert result["newly_denied"]["count"] == 2
    assert {e["run"] for e in result["newly_denied"]["examples"]} == {str(bare.pk)}
    assert result["newly_denied"]["examples"][0]["reason"] == "missing scopes"
    assert result["calls_evaluated"] == 4


def test_an_approval_condition_counts_only_the_calls_it_holds_for(world: World) -> None:
    run = _run(world)
    _seed(world, run, at=_ago(5), args={"order_id": "O1", "amount": 150})
    _seed(world, run, at=_ago(4), args={"order_id": "O2", "amount": 20})
    _seed(world, run, at=_ago(3), args={"order_id": "O3", "amount": 101})
    policy = {"mode": "condition", "condition": {"field": "amount", "op": ">", "value": 100}}
    result = _preview(world, approval_policy=policy)
    assert result["newly_needs_approval"]["count"] == 2
    assert all("amount" in e["reason"] for e in result["newly_needs_approval"]["examples"])


def test_a_rate_limit_is_replayed_on_the_recorded_timestamps(world: World) -> None:
    run = _run(world)
    start = _ago(120)
    # 2 per minute: a bucket of 2 refilled one token per 30 s. Calls at 0, 1, 2, 3, 31, 32 s:
    # 0 and 1 admitted, 2 and 3 limited, 31 admitted (one token back), 32 limited -> 3 limited by hand.
    for second in (0, 1, 2, 3, 31, 32):
        _seed(world, run, at=start + timedelta(seconds=second))
    # the same call seen again (its approval, then its run) is counted once, as the gateway does
    _seed(world, run, at=start + timedelta(seconds=90), call="again")
    _seed(world, run, at=start + timedelta(seconds=91), call="again")
    result = _preview(world, rate_limit_per_minute=2)
    assert result["newly_rate_limited"]["count"] == 3
    assert result["newly_rate_limited"]["examples"][0]["reason"] == "over 2 calls per minute"
    # raising a limit is the reverse: the calls limited before are newly allowed
    Tool.objects.filter(tenant=world.tenant, name=TOOL).update(rate_limit_per_minute=2)
    assert _preview(world, rate_limit_per_minute=100)["newly_allowed"]["count"] == 3


def test_rows_are_read_in_chunks_and_capped_with_a_clear_truncation(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shadow, "CHUNK", 2)
    run = _run(world)
    for i in range(5):
        _seed(world, run, at=_ago(50 - i))
    _seed(world, run, at=timezone.now() - timedelta(days=9))  # outside the 7 days
    full = _preview(world, enabled=False)
    assert full["newly_denied"]["count"] == 5 and not full["truncated"] and full["truncated_at"] is None
    assert _preview(world, enabled=False, days=10)["newly_denied"]["count"] == 6
    capped = _preview(world, enabled=False, cap=3)
    assert capped["truncated"] and capped["truncated_at"] == 3 and capped["calls_evaluated"] == 3
    assert capped["note"] == "truncated at 3 calls: later calls were not replayed"
    assert capped["newly_denied"]["count"] == 3


def test_a_preview_writes_nothing(world: World) -> None:
    run = _run(world)
    for i in range(3):
        _seed(world, run, at=_ago(10 - i))
    tool = Tool.objects.get(tenant=world.tenant, name=TOOL)
    counts = (ToolCallAudit.objects.count(), ConfigChange.objects.count())
    with CaptureQueriesContext(connection) as queries:
        result = _preview(world, enabled=False, rate_limit_per_minute=1, required_scopes=["x"])
    writes = [q["sql"] for q in queries.captured_queries if re.match(r"\s*(INSERT|UPDATE|DELETE)", q["sql"], re.I)]
    assert writes == []
    assert result["newly_denied"]["count"] == 3
    after = Tool.objects.get(pk=tool.pk)
    assert (after.enabled, after.rate_limit_per_minute, after.required_scopes, after.updated_at) == (
        True, None, [], tool.updated_at)
    assert (ToolCallAudit.objects.count(), ConfigChange.objects.count()) == counts


def test_secrets_in_recorded_arguments_never_reach_the_result(world: World) -> None:
    run = _run(world)
    _seed(world, run, at=_ago(3), args={"order_id": "O1", "email": "alice@example.com", "phone": "13812345678"})
    result = _preview(world, enabled=False)
    text = json.dumps(result)
    assert result["newly_denied"]["count"] == 1
    assert "alice@example.com" not in text and "13812345678" not in text


def test_another_tenants_rows_are_never_counted_and_its_tool_is_404(world: World) -> None:
    other = make_world()
    mine, theirs = _run(world), _run(other)
    _seed(world, mine, at=_ago(3))
    for i in range(4):
        _seed(other, theirs, at=_ago(3 + i))
    result = _preview(world, enabled=False)
    assert result["newly_denied"]["count"] == 1 and result["newly_denied"]["by_tenant"] == {world.tenant.slug: 1}
    only_mine = Tool.objects.create(tenant=world.tenant, name="private_tool", description="x")
    response = _api(other).post(f"/api/v1/tools/{only_mine.name}/preview-impact", {"enabled": False}, format="json")
    assert response.status_code == 404
    by_id = _api(other).post(f"/api/v1/tools/{only_mine.pk}/preview-impact", {"enabled": False}, format="json")
    assert by_id.status_code == 404
    # B previewing its own same-named tool counts only its own four rows
    response = _api(other).post(f"/api/v1/tools/{TOOL}/preview-impact", {"enabled": False}, format="json")
    assert response.status_code == 200 and response.json()["newly_denied"]["count"] == 4


def test_the_api_previews_through_drf(world: World) -> None:
    run = _run(world)
    for i in range(3):  # within one minute: at 1 per minute the first passes, the other two are limited
        _seed(world, run, at=_ago(10) + timedelta(seconds=i))
    response = _api(world).post(f"/api/v1/tools/{TOOL}/preview-impact", {"rate_limit_per_minute": 1, "days": 1}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["days"] == 1 and body["changed"] == ["rate_limit_per_minute"]
    assert body["calls_evaluated"] == 3 and body["newly_rate_limited"]["count"] == 2
    assert Tool.objects.get(tenant=world.tenant, name=TOOL).rate_limit_per_minute is None


@pytest.mark.parametrize(("body", "field"), [
    ({"days": 0}, "days"), ({"days": 31}, "days"), ({"days": "many"}, "days"),
    ({"rate_limit_per_minute": 0}, "rate_limit_per_minute"), ({"enabled": "maybe"}, "enabled"),
    ({"required_scopes": "orders"}, "required_scopes"), ({"approval_policy": []}, "approval_policy"),
    ({"approval_policy": {"mode": "sometimes"}}, "approval_policy"),
])
def test_bad_input_is_a_400_naming_the_field(world: World, body: dict[str, Any], field: str) -> None:
    response = _api(world).post(f"/api/v1/tools/{TOOL}/preview-impact", body, format="json")
    assert response.status_code == 400, response.content
    assert field in json.dumps(response.json())


def test_loosening_a_floor_is_refused_exactly_as_saving_it(world: World) -> None:
    Tool.objects.filter(tenant=world.tenant, name=TOOL).update(requires_approval=True)
    api = _api(world)  # an operator's API key: may not loosen a tool's own approval policy
    preview = api.post(f"/api/v1/tools/{TOOL}/preview-impact", {"requires_approval": False}, format="json")
    save = api.patch(f"/api/v1/tools/{TOOL}", {"requires_approval": False}, format="json")
    assert preview.status_code == save.status_code == 400
    assert preview.json() == save.json()
    with pytest.raises(ToolRefused):
        _preview(world, days=99, enabled=False)


def test_the_admin_form_previews_its_unsaved_values_with_csrf(world: World) -> None:
    run = _run(world)
    for i in range(4):
        _seed(world, run, at=_ago(10) + timedelta(seconds=i))
    tool = Tool.objects.get(tenant=world.tenant, name=TOOL)
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.operator)
    url = f"/admin/tools/tool/{tool.pk}/change/"
    page = client.get(url)
    assert b'name="_preview_impact"' in page.content
    form = page.context["adminform"].form
    data: dict[str, Any] = {}
    for name in form.fields:
        value = form[name].value()
        if isinstance(value, dict | list):
            value = json.dumps(value)
        if value is None or value is False:
            continue
        data[name] = "on" if value is True else value
    data.update(rate_limit_per_minute="1", _preview_impact="1", _preview_days="7")
    assert client.post(url, data).status_code == 403  # no CSRF token
    data["csrfmiddlewaretoken"] = page.context["csrf_token"]
    response = client.post(url, data)
    assert response.status_code == 200, response.content[:2000]
    html = response.content.decode()
    assert 'id="impact"' in html and "Newly rate limited" in html
    assert re.search(r'class="impact-newly-rate-limited"><td>Newly rate limited</td><td>3</td>', html)
    assert Tool.objects.get(pk=tool.pk).rate_limit_per_minute is None
    data["rate_limit_per_minute"] = "0"
    refused = client.post(url, data)
    assert refused.status_code == 400 and b"rate_limit_per_minute" in refused.content
    assert actor_for_user(world.operator) is not None


# -- an agent version's proposed tool list and approval overrides ------------------------------------------------


def _version_url(world: World) -> str:
    return f"/api/v1/agents/{world.agent.slug}/versions/{world.version.number}/preview-impact"


def test_a_version_preview_counts_the_allow_list_and_new_approval_overrides(world: World) -> None:
    run = _run(world)
    for i in range(3):
        _seed(world, run, at=_ago(10 - i))
    _seed(world, run, at=_ago(5), tool="query_logistics")
    tools = [t for t in world.version.tools if t != TOOL]
    response = _api(world).post(_version_url(world), {"tools": tools}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["changed"] == ["tools"] and body["calls_evaluated"] == 4
    assert body["newly_denied"]["count"] == 3 and body["newly_denied"]["by_tool"] == {TOOL: 3}
    policy = {**world.version.policy, "approvals": {"tools": {"query_logistics": {"mode": "always"}}}}
    response = _api(world).post(_version_url(world), {"policy": policy}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["newly_needs_approval"]["by_tool"] == {"query_logistics": 1}
    world.version.refresh_from_db()
    assert TOOL in world.version.tools and "approvals" not in world.version.policy  # nothing saved


def test_a_version_preview_is_tenant_scoped_and_refuses_bad_input(world: World) -> None:
    other = make_world()
    _seed(world, _run(world), at=_ago(3))
    # the same slug and number in B: B previews its own version, and A's rows are never counted
    same = _api(other).post(_version_url(world), {"tools": []}, format="json")
    assert same.status_code == 200 and same.json()["calls_evaluated"] == 0 and same.json()["tenant"] == other.tenant.slug
    assert _api(world).post(_version_url(world), {"tools": []}, format="json").json()["newly_denied"]["count"] == 1
    world.agent.slug = "only-in-a"
    world.agent.save(update_fields=["slug"])
    assert _api(other).post(_version_url(world), {"tools": []}, format="json").status_code == 404
    bad = _api(world).post(_version_url(world), {"days": 0}, format="json")
    assert bad.status_code == 400 and "days" in bad.content.decode()
    bad = _api(world).post(_version_url(world), {"policy": {"limits": {"max_recursion": "lots"}}}, format="json")
    assert bad.status_code == 400 and "max_recursion" in bad.content.decode()


def test_the_replay_costs_the_same_queries_however_many_rows_one_run_has_and_its_grants_once(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    computed: list[Any] = []
    real = shadow.session_grants

    def counting(run: Any, plugin_scopes: set[str] | None = None) -> set[str]:
        computed.append(run.pk)
        return real(run, plugin_scopes)

    monkeypatch.setattr(shadow, "session_grants", counting)
    run, other = _run(world, facts={"grants": ["orders:read"]}), _run(world)

    def queries_for(rows: int) -> tuple[int, int]:
        ToolCallAudit.objects.all().delete()
        for i in range(rows):
            _seed(world, run, at=_ago(50) + timedelta(seconds=i))
        _seed(world, other, at=_ago(40))
        counts = []
        for preview in (lambda: _preview(world, required_scopes=["orders:read"]),
                        lambda: shadow.preview_version_change(version=world.version, actor=actor_for_api_key(world.key),
                                                              fields={"tools": []})):
            computed.clear()
            with CaptureQueriesContext(connection) as queries:
                result = preview()
            assert result["calls_evaluated"] == rows + 1
            assert sorted(computed, key=str) == sorted([run.pk, other.pk], key=str)  # once per run, not per row
            counts.append(len(queries.captured_queries))
        return counts[0], counts[1]

    assert queries_for(3) == queries_for(30)
