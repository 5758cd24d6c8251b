"""Issue #13 item 10 with the database: where a tool's rate limit is set (API, admin, plugin declaration), the plugin
floor, and how the rate_limit stage meets the approval gate and the exactly-once write path.

The stage itself (counting, the message, the trace, Redis shared by two gateways and two processes) is tested
without a database in tests/unit/tools/test_tool_rate_limit.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

import tests.support.tools  # noqa: F401 - registers test.note
from agents import services as run_services
from approvals.gate import ApprovalGate
from approvals.models import ApprovalRequest, ApprovalStatus
from audit.chain import write_sealed
from audit.models import ConfigChange, ToolCallAudit
from audit.unit_of_work import StepAudit
from llm.ratelimit import LocalBucketStore
from marketplace import installs as market_installs
from marketplace import services as market
from marketplace.catalog import PluginCatalog, PluginDeclarationError, PluginSpec, PluginTool
from runtime.types import ToolCall, ToolContext, ToolStatus
from tenants.scoping import actor_for_api_key, actor_for_user
from tests.factories import World
from tests.support.clients import bearer_client
from tools.gateway import ToolGateway
from tools.models import Tool
from tools.services import install_python_tool

pytestmark = pytest.mark.django_db

REFUND = {"order_id": "O202411280001", "amount": "30.00", "reason": "the glass cup broke"}
MESSAGE = "Must be a whole number of calls per minute from 1 to 100000, or empty for no limit"


@pytest.fixture
def api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _admin(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _form_data(client: Client, url: str, **changes: Any) -> dict[str, Any]:
    """The admin form as the page shows it, with ``changes`` typed in (as tests/db/test_tool_admin.py does)."""
    form = client.get(url).context["adminform"].form
    data: dict[str, Any] = {}
    for name in form.fields:
        value = changes.get(name, form[name].value())
        if isinstance(value, dict | list):
            value = json.dumps(value)
        if value is None or value is False:
            continue
        data[name] = "on" if value is True else value
    return data


# -- the API ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 100_001, "many", 2.5])
def test_the_api_refuses_a_limit_outside_1_to_100000_naming_the_field(world: World, api: APIClient, bad: Any) -> None:
    response = api.patch("/api/v1/tools/query_order", {"rate_limit_per_minute": bad}, format="json")
    assert response.status_code == 400, response.content
    message = response.json()["rate_limit_per_minute"][0]
    assert message.startswith(MESSAGE) or message == "A valid integer is required.", message
    assert Tool.objects.get(tenant=world.tenant, name="query_order").rate_limit_per_minute is None


def test_the_api_sets_shows_and_clears_a_tenant_tools_limit_audited(world: World, api: APIClient) -> None:
    assert api.get("/api/v1/tools/query_order").json()["rate_limit_per_minute"] is None
    response = api.patch("/api/v1/tools/query_order", {"rate_limit_per_minute": 100_000}, format="json")
    assert response.status_code == 200 and response.json()["rate_limit_per_minute"] == 100_000, response.content
    change = ConfigChange.objects.filter(tenant=world.tenant, action="tool.updated").latest("created_at")
    assert change.details["changed"] == ["rate_limit_per_minute"]
    assert api.patch("/api/v1/tools/query_order", {"rate_limit_per_minute": None}, format="json").json()[
        "rate_limit_per_minute"] is None
    schema = api.get("/api/schema/?format=json").json()
    field = schema["components"]["schemas"]["Tool"]["properties"]["rate_limit_per_minute"]
    assert (field["minimum"], field["maximum"], field.get("nullable")) == (1, 100_000, True), field


# -- the admin, through the tool service --------------------------------------------------------------------------


def test_the_admin_saves_a_limit_through_the_service_and_refuses_a_bad_one(world: World) -> None:
    tool = Tool.objects.get(tenant=world.tenant, name="query_order")
    client = _admin(world.operator)
    url = reverse("admin:tools_tool_change", args=[tool.pk])
    refused = client.post(url, _form_data(client, url, rate_limit_per_minute=0))
    assert refused.status_code == 200 and MESSAGE in refused.content.decode()
    saved = client.post(url, _form_data(client, url, rate_limit_per_minute=30))
    assert saved.status_code == 302, saved.context["adminform"].form.errors if saved.context else saved.content[:500]
    assert Tool.objects.get(pk=tool.pk).rate_limit_per_minute == 30
    change = ConfigChange.objects.filter(tenant=world.tenant, action="tool.updated", actor=world.operator).latest("created_at")
    assert change.details["changed"] == ["rate_limit_per_minute"], "saved by the tool service, with its audit row"
    assert "rate_limit_per_minute" in client.get(reverse("admin:tools_tool_changelist")).content.decode()


# -- a plugin's declared limit is a floor -------------------------------------------------------------------------


def _notes_catalog(version: str, limit: int | None) -> PluginCatalog:
    overrides = {"rate_limit_per_minute": limit} if limit is not None else {}
    plugins = PluginCatalog()
    plugins.register(PluginSpec(key="notes-desk", name="Notes desk", version=version,
                                tools=(PluginTool("test.note", overrides=overrides),)))
    plugins.freeze()
    return plugins


@pytest.mark.parametrize("bad", [0, 100_001, "10", True, 1.5])
def test_a_plugin_declaring_a_bad_limit_is_refused_naming_the_tool(bad: Any) -> None:
    with pytest.raises(PluginDeclarationError, match=r"plugin tool 'test.note': overrides.rate_limit_per_minute: Must be"):
        PluginCatalog().register(PluginSpec(key="notes-desk", name="Notes desk", version="1.0.0",
                                            tools=(PluginTool("test.note", overrides={"rate_limit_per_minute": bad}),)))


def test_a_tenant_may_lower_a_plugins_limit_but_not_raise_or_remove_it(world: World, api: APIClient,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    owner = world.owner
    monkeypatch.setattr(market_installs, "catalog", _notes_catalog("1.0.0", 10))
    install = market.install_plugin(tenant=world.tenant, plugin_key="notes-desk", actor=actor_for_user(owner))
    tool = Tool.objects.get(tenant=world.tenant, name="note")
    assert tool.plugin_install_id == install.pk and tool.rate_limit_per_minute == 10, "the manifest's limit is on the tool"
    # raising or removing it is a 400 naming the field and the plugin's limit
    for value, words in ((20, "not raise it to 20"), (None, "not remove it")):
        response = api.patch("/api/v1/tools/note", {"rate_limit_per_minute": value}, format="json")
        assert response.status_code == 400, response.content
        message = response.json()["rate_limit_per_minute"][0]
        assert message == f"The plugin 'notes-desk' limits note to 10 calls per minute; you can lower that limit (1 to 10) but {words}."
    # lowering it is allowed (and audited); the plugin's other fields still cannot change
    assert api.patch("/api/v1/tools/note", {"rate_limit_per_minute": 4}, format="json").status_code == 200
    other = api.patch("/api/v1/tools/note", {"timeout_seconds": 3}, format="json")
    assert other.status_code == 400 and "lower its rate limit" in other.json()["timeout_seconds"][0]
    # a refresh or an upgrade of the plugin keeps the tenant's lower limit; going back up to the plugin's is allowed
    market.install_plugin(tenant=world.tenant, plugin_key="notes-desk", actor=actor_for_user(owner))
    assert Tool.objects.get(pk=tool.pk).rate_limit_per_minute == 4
    monkeypatch.setattr(market_installs, "catalog", _notes_catalog("1.1.0", 6))
    install.refresh_from_db()
    market.upgrade_plugin(install=install, actor=actor_for_user(owner))
    assert Tool.objects.get(pk=tool.pk).rate_limit_per_minute == 4
    assert api.patch("/api/v1/tools/note", {"rate_limit_per_minute": 6}, format="json").status_code == 200
    assert api.patch("/api/v1/tools/note", {"rate_limit_per_minute": 7}, format="json").status_code == 400
    # in the admin, raising it is a form error, not a save
    client = _admin(world.operator)
    url = reverse("admin:tools_tool_change", args=[tool.pk])
    raised = client.post(url, _form_data(client, url, rate_limit_per_minute=50))
    assert raised.status_code == 200 and "you can lower that limit (1 to 6) but not raise it to 50" in raised.content.decode()
    lowered = client.post(url, _form_data(client, url, rate_limit_per_minute=2))
    assert lowered.status_code == 302 and Tool.objects.get(pk=tool.pk).rate_limit_per_minute == 2


def test_a_plugin_without_a_limit_leaves_the_tenant_free(world: World, api: APIClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(market_installs, "catalog", _notes_catalog("1.0.0", None))
    market.install_plugin(tenant=world.tenant, plugin_key="notes-desk", actor=actor_for_user(world.owner))
    assert Tool.objects.get(tenant=world.tenant, name="note").rate_limit_per_minute is None
    assert api.patch("/api/v1/tools/note", {"rate_limit_per_minute": 500}, format="json").status_code == 200
    assert api.patch("/api/v1/tools/note", {"rate_limit_per_minute": None}, format="json").status_code == 200


# -- the stage meets the approval gate and the exactly-once write path -------------------------------------------


def _gateway(world: World, run: Any, tools: list[Tool], store: LocalBucketStore, buffer: StepAudit) -> ToolGateway:
    run.version.tools = [t.name for t in tools]
    return ToolGateway(run=run, tools=tools, audit=buffer, approvals=ApprovalGate(run), bucket_store=store)


def _run(world: World) -> Any:
    return run_services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="refund please")


def test_a_limited_call_creates_no_approval_request_and_an_approved_one_is_not_counted_twice(world: World) -> None:
    refund = install_python_tool(tenant=world.tenant, key="order_desk.refund_order", actor=None, requires_approval=True,
                                 rate_limit_per_minute=1)
    run, store, buffer = _run(world), LocalBucketStore(), StepAudit()
    ctx = ToolContext(run_id="r", step=1, span_id="s")
    # the first call is counted and asks for approval
    first = _gateway(world, run, [refund], store, buffer).execute(ToolCall("c1", "refund_order", json.dumps(REFUND)), ctx)
    assert first.status == ToolStatus.PENDING_APPROVAL
    # a second call in the same minute is rate limited: no approval request for it
    other = {**REFUND, "order_id": "O202411280002"}
    limited = _gateway(world, run, [refund], store, buffer).execute(ToolCall("c2", "refund_order", json.dumps(other)), ctx)
    assert limited.status == ToolStatus.RATE_LIMITED
    assert list(ApprovalRequest.objects.filter(run=run).values_list("call_id", flat=True)) == ["c1"]
    # once approved, the first call is dispatched without being counted again
    ApprovalRequest.objects.filter(run=run, call_id="c1").update(status=ApprovalStatus.APPROVED)
    dispatched = _gateway(world, run, [refund], store, buffer).execute(ToolCall("c1", "refund_order", json.dumps(REFUND)), ctx)
    assert dispatched.status == ToolStatus.OK, dispatched.content
    stage = next(e for e in dispatched.trace if e.get("stage") == "rate_limit")
    assert stage["ok"] and stage["counted"] is False and "approval" in stage["reason"]
    with transaction.atomic():
        write_sealed(buffer, world.tenant.pk)
    assert sorted(ToolCallAudit.objects.filter(run=run).values_list("status", flat=True)) == [
        "ok", "pending_approval", "rate_limited"]


def test_the_resumed_attempt_of_a_crashed_write_is_not_counted_again(world: World) -> None:
    note = install_python_tool(tenant=world.tenant, key="test.note", actor=None, idempotent=True, rate_limit_per_minute=1)
    run, store = _run(world), LocalBucketStore()
    ctx = ToolContext(run_id="r", step=1, span_id="s")
    call = json.dumps({"text": "call back"})
    assert _gateway(world, run, [note], store, StepAudit()).execute(ToolCall("A", "note", call), ctx).status == ToolStatus.OK
    # the worker dies before the step commits; the resumed step's attempt finds the started row and completes it
    buffer = StepAudit()
    resumed = _gateway(world, run, [note], store, buffer).execute(ToolCall("B", "note", call), ctx)
    assert resumed.status == ToolStatus.OK, resumed.content
    with transaction.atomic():
        write_sealed(buffer, world.tenant.pk)
    row = ToolCallAudit.objects.get(run=run)
    assert (row.status, row.attempt_call_ids) == ("ok", ["A", "B"])
    # while a new call in the same minute is limited
    other = _gateway(world, run, [note], store, StepAudit()).execute(ToolCall("C", "note", json.dumps({"text": "x"})),
                                                            ToolContext(run_id="r", step=2, span_id="s"))
    assert other.status == ToolStatus.RATE_LIMITED
