"""A tool's own approval policy is a floor: versions may make it stricter; only the tenant's owner, in person, may loosen it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts import services as tenant_services
from agents import services
from agents.engine import approval_overrides, session_grants
from agents.models import AgentVersion
from approvals.gate import ApprovalGate
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.policy import FLOOR_OVERRIDE_ACTION
from audit.models import ConfigChange
from audit.unit_of_work import StepAudit
from marketplace.services import install_plugin
from runtime.types import ToolCall, ToolContext, ToolStatus
from tenants.models import Role
from tenants.scoping import actor_for_api_key, actor_for_user
from tests.factories import World, make_user, make_world
from tools.gateway import ToolGateway
from tools.models import Tool
from tools.services import install_python_tool

pytestmark = pytest.mark.django_db

NEVER = {"approvals": {"tools": {"refund_order": {"mode": "never"}}}}
REFUND = {"order_id": "O202411280001", "amount": "30.00", "reason": "the glass cup broke"}


@dataclass
class Setup:
    world: World
    owner: Any
    owner_key: str
    refund: Tool


@pytest.fixture
def setup() -> Setup:
    world = make_world()
    owner = make_user(f"{world.tenant.slug}-owner", is_staff=True)
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    _key, raw = tenant_services.create_api_key(tenant=world.tenant, name="owner's", owner=owner, role=Role.OWNER, actor=None)
    refund = install_python_tool(tenant=world.tenant, key="order_desk.refund_order", actor=None, requires_approval=True)
    return Setup(world, owner, raw, refund)


def _key_client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _session_client(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _post_version(client: APIClient, policy: dict[str, Any], tools: list[str] | None = None) -> Any:
    body = {"model": "demo/planner", "tools": tools or ["query_order", "refund_order"], "policy": policy}
    return client.post("/api/v1/agents/order-assistant/versions", body, format="json")


def _entry(**fields: Any) -> dict[str, Any]:
    return {"approvals": {"tools": {"refund_order": fields}}}


def _gate_refund(world: World, version: AgentVersion) -> Any:
    """Drive the tool gateway as the engine wires it, for one refund call of a run on ``version``."""
    world.agent.current_version = version
    world.agent.save(update_fields=["current_version"])
    run = services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="refund 30.00 please")
    assert run.version_id == version.pk
    rows = list(Tool.objects.for_tenant(world.tenant).filter(name__in=version.tools))
    buffer = StepAudit()
    gateway = ToolGateway(run=run, tools=rows, audit=buffer, grants=session_grants(run),
                          approvals=ApprovalGate(run, overrides=approval_overrides(run)))
    outcome = gateway.execute(ToolCall("c1", "refund_order", json.dumps(REFUND)), ToolContext(run_id=str(run.pk), step=1, span_id="s"))
    return outcome, ApprovalRequest.objects.filter(run=run).first()


def test_an_operator_key_cannot_switch_off_the_approval_of_a_tool_that_requires_it(setup: Setup) -> None:
    # given an operator's key; when it posts a version whose policy says refund_order never needs approval
    response = _post_version(_key_client(setup.world.raw_key), NEVER)
    # then it is a 400 naming the field, the floor, and who may loosen it; no version is stored
    assert response.status_code == 400, response.content
    message = response.json()["policy"][0]
    assert message.startswith('policy.approvals.tools.refund_order.mode: "never" is looser than the tool\'s floor "always"')
    assert "only the tenant owner can loosen it (explicit override)" in message
    assert AgentVersion.objects.filter(agent=setup.world.agent).count() == 1


def test_the_owners_api_key_cannot_loosen_it_either_keys_are_not_persons(setup: Setup) -> None:
    client = _key_client(setup.owner_key)
    plain = _post_version(client, NEVER)
    assert plain.status_code == 400 and "refund_order.mode" in plain.json()["policy"][0]
    flagged = _post_version(client, _entry(mode="never", override_floor=True))
    assert flagged.status_code == 400
    assert "policy.approvals.tools.refund_order.override_floor: only the tenant's owner, signed in" in flagged.json()["policy"][0]
    assert not ConfigChange.objects.filter(action=FLOOR_OVERRIDE_ACTION).exists()


@pytest.mark.parametrize(("loose", "field"), [
    ({"mode": "always", "expires_in_seconds": 7200}, "expires_in_seconds"),
    ({"mode": "always", "approver_roles": ["operator", "approver"]}, "approver_roles"),
    ({"mode": "condition", "condition": {"field": "amount", "op": ">", "value": 100}}, "mode"),
])
def test_every_looser_field_is_refused_by_name(setup: Setup, loose: dict[str, Any], field: str) -> None:
    response = _post_version(_key_client(setup.world.raw_key), _entry(**loose))
    assert response.status_code == 400, response.content
    assert f"policy.approvals.tools.refund_order.{field}:" in " ".join(response.json()["policy"])


def test_a_tighter_floor_on_the_tool_row_counts_field_by_field(setup: Setup) -> None:
    # given a tool whose own policy asks two approvers above 100, within 10 minutes, approvers only
    Tool.objects.filter(pk=setup.refund.pk).update(approval_policy={
        "mode": "condition", "condition": {"field": "amount", "op": ">", "value": 100}, "four_eyes": True,
        "expires_in_seconds": 600, "approver_roles": ["approver"]})
    client = _key_client(setup.world.raw_key)
    # then a higher threshold, one approver, a longer wait or a wider set of approvers are each refused by name
    higher = _post_version(client, _entry(mode="condition", condition={"field": "amount", "op": ">", "value": 500}, four_eyes=True))
    assert "refund_order.conditions: no condition covers the tool's floor condition amount > 100" in higher.json()["policy"][0]
    one = _post_version(client, _entry(mode="always", four_eyes=False))
    assert "refund_order.four_eyes: false is looser" in one.json()["policy"][0]
    # and stricter ones are accepted: a lower threshold, always, two approvers, a shorter wait, fewer roles
    lower = _post_version(client, _entry(mode="condition", conditions=[{"field": "amount", "op": ">=", "value": 50}], four_eyes=True))
    assert lower.status_code == 201, lower.content
    strict = _post_version(client, _entry(mode="always", four_eyes=True, expires_in_seconds=300, approver_roles=["approver"]))
    assert strict.status_code == 201, strict.content


def test_stricter_policies_are_still_accepted_from_an_operator_key(setup: Setup) -> None:
    client = _key_client(setup.world.raw_key)
    for policy in (_entry(mode="always", four_eyes=True), _entry(expires_in_seconds=120, approver_roles=["owner"]),
                   {"approvals": {"tools": {"query_order": {"mode": "condition",
                                                            "condition": {"field": "order_id", "op": "==", "value": "O1"}}}}}):
        response = _post_version(client, policy)
        assert response.status_code == 201, response.content
    assert not ConfigChange.objects.filter(action=FLOOR_OVERRIDE_ACTION).exists()


def test_an_approval_entry_with_a_bad_value_is_a_400_naming_it(setup: Setup) -> None:
    response = _post_version(_key_client(setup.world.raw_key), _entry(mode="sometimes"))
    assert response.status_code == 400
    assert "approvals.tools.refund_order.mode: must be always, never or condition" in " ".join(response.json()["policy"])


def test_the_admin_refuses_a_looser_policy_from_a_tenant_operator_with_a_form_error(setup: Setup) -> None:
    client = Client()
    client.force_login(setup.world.operator)
    form = {"tenant": setup.world.tenant.pk, "agent": setup.world.agent.pk, "number": 7, "model": "demo/planner",
            "system_prompt": "", "tools": json.dumps(["refund_order"]), "policy": json.dumps(NEVER), "note": ""}
    response = client.post("/admin/agents/agentversion/add/", form)
    assert response.status_code == 200, "the form is shown again with the error"
    assert "policy.approvals.tools.refund_order.mode" in response.content.decode()
    assert not AgentVersion.objects.filter(agent=setup.world.agent, number=7).exists()
    # while a stricter one is saved through the service, authored by the operator and audited
    form["policy"] = json.dumps(_entry(mode="always", four_eyes=True))
    assert client.post("/admin/agents/agentversion/add/", form).status_code == 302
    saved = AgentVersion.objects.get(agent=setup.world.agent, number=7)
    assert saved.created_by == setup.world.operator
    assert ConfigChange.objects.filter(action="agent_version.created", target_id=str(saved.pk)).exists()


def test_the_owner_signed_in_loosens_it_explicitly_and_that_is_audited_and_honoured(setup: Setup) -> None:
    client = _session_client(setup.owner)
    # given the owner, signed in: without the explicit flag it is still refused, and says how to loosen it
    unflagged = _post_version(client, NEVER)
    assert unflagged.status_code == 400 and '"override_floor": true' in unflagged.json()["policy"][0]
    # when the owner loosens it explicitly
    response = _post_version(client, _entry(mode="never", override_floor=True))
    # then the version is saved with a config-change row holding the floor, before and after
    assert response.status_code == 201, response.content
    version = AgentVersion.objects.get(agent=setup.world.agent, number=response.json()["number"])
    change = ConfigChange.objects.get(action=FLOOR_OVERRIDE_ACTION, target_id=str(version.pk))
    assert change.actor == setup.owner and change.tenant == setup.world.tenant
    assert change.details["tool"] == "refund_order" and change.details["floor"]["mode"] == "always"
    assert change.details["before"] is None and change.details["after"] == {"mode": "never", "override_floor": True}
    # and an operator editing the policy later may keep the owner's loosening, not add one of their own
    operator = _key_client(setup.world.raw_key)
    url = f"/api/v1/agents/order-assistant/versions/{version.number}"
    kept = operator.patch(url, {"policy": {**version.policy, "limits": {"max_recursion": 5}}}, format="json")
    assert kept.status_code == 200, kept.content
    widened = operator.patch(url, {"policy": _entry(mode="never", override_floor=True, four_eyes=False)}, format="json")
    assert widened.status_code == 400 and "override_floor" in widened.json()["policy"][0]
    # and the run-time gate honours the owner's override: the refund needs no approval on this version
    version.refresh_from_db()
    outcome, request = _gate_refund(setup.world, version)
    assert request is None and outcome.status != ToolStatus.PENDING_APPROVAL


@pytest.mark.parametrize("entry", [{"mode": "never"}, {"mode": "never", "override_floor": True}])
def test_a_version_row_forced_into_the_database_still_gets_an_approval_request(setup: Setup, entry: dict[str, Any]) -> None:
    # given a version row that never went through the service (no owner override on record)
    version = AgentVersion.objects.create(tenant=setup.world.tenant, agent=setup.world.agent, number=9, model="demo/planner",
                                          tools=["query_order", "refund_order"], policy={"approvals": {"tools": {"refund_order": entry}}})
    # when a run of it calls the refund
    outcome, request = _gate_refund(setup.world, version)
    # then the call waits for a person, as the tool's floor says
    assert outcome.status == ToolStatus.PENDING_APPROVAL
    assert request is not None and request.status == ApprovalStatus.PENDING and request.tool_name == "refund_order"


def test_a_plugin_tool_keeps_its_declared_floor_even_if_its_row_is_loosened(setup: Setup) -> None:
    # given the order-desk plugin installed (it declares refund_order as needing approval) and its row edited to "never"
    Tool.objects.filter(pk=setup.refund.pk).delete()
    install_plugin(tenant=setup.world.tenant, plugin_key="order-desk", actor=actor_for_user(setup.owner))
    refund = Tool.objects.get(tenant=setup.world.tenant, name="refund_order")
    assert refund.plugin_install_id is not None
    Tool.objects.filter(pk=refund.pk).update(requires_approval=False, approval_policy={"mode": "never"})
    # then a version may still not loosen it through the API
    assert _post_version(_key_client(setup.world.raw_key), NEVER).status_code == 400
    # and a run of a version that says nothing about it still asks a person (the declaration is the floor)
    version = AgentVersion.objects.create(tenant=setup.world.tenant, agent=setup.world.agent, number=9, model="demo/planner",
                                          tools=["refund_order"], policy={})
    outcome, request = _gate_refund(setup.world, version)
    assert outcome.status == ToolStatus.PENDING_APPROVAL and request is not None


def test_a_runs_plugin_tools_come_with_their_declaration_so_a_call_reads_no_plugin_row(
        setup: Setup, django_assert_num_queries: Any) -> None:
    from agents.engine import visible_tools
    from agents.models import Run, Session
    from approvals.policy import declared_policy

    Tool.objects.filter(pk=setup.refund.pk).delete()
    install_plugin(tenant=setup.world.tenant, plugin_key="order-desk", actor=actor_for_user(setup.owner))
    version = AgentVersion.objects.create(tenant=setup.world.tenant, agent=setup.world.agent, number=9, model="demo/planner",
                                          tools=["refund_order"], policy={})
    session = Session.objects.create(tenant=setup.world.tenant, agent=setup.world.agent)
    run = Run.objects.create(tenant=setup.world.tenant, agent=setup.world.agent, version=version, session=session, input="x")
    [refund] = visible_tools(Run.objects.select_related("version").get(pk=run.pk))
    with django_assert_num_queries(0):  # the install and the plugin were read with the tool, once per run
        declared = declared_policy(refund)
    assert declared is not None and declared["mode"] == "always"
