"""Approval policies: when a call needs a person, and who may decide."""

from __future__ import annotations

import pytest

from approvals.decisions import may_decide
from approvals.models import ApprovalRequest
from approvals.policy import policy_errors, rule_for
from tenants.scoping import Actor
from tools.models import Tool


def _tool(**fields: object) -> Tool:
    return Tool(name="refund_order", description="Refund", **fields)


def test_the_simple_switch_and_the_modes() -> None:
    assert rule_for(_tool(requires_approval=True), {}).needed
    assert not rule_for(_tool(requires_approval=False), {}).needed
    assert not rule_for(_tool(requires_approval=True, approval_policy={"mode": "never"}), {}).needed
    assert rule_for(_tool(approval_policy={"mode": "always", "four_eyes": True}), {}).four_eyes


@pytest.mark.parametrize(("amount", "needed"), [("99.99", False), ("100.01", True), (250, True), (None, True)])
def test_a_condition_on_the_arguments(amount: object, needed: bool) -> None:
    tool = _tool(approval_policy={"mode": "condition", "condition": {"field": "amount", "op": ">", "value": 100}})
    rule = rule_for(tool, {"amount": amount} if amount is not None else {})
    assert rule.needed is needed
    if needed:
        assert "amount > 100" in rule.reason


def test_an_agent_version_can_make_the_tools_policy_stricter_but_only_an_owner_override_looser() -> None:
    tool = _tool(requires_approval=True)
    assert rule_for(tool, {}, {"mode": "never"}).needed, "the tool's own policy is a floor"
    assert not rule_for(tool, {}, {"mode": "never"}, owner_override=True).needed
    assert rule_for(_tool(), {"amount": "5"}, {"mode": "condition", "conditions": [{"field": "amount", "op": ">=", "value": 5}]}).needed


def test_policy_errors_name_the_field() -> None:
    assert policy_errors({"mode": "always"}) == []
    errors = policy_errors({"mode": "sometimes", "expires_in_seconds": 1, "approver_roles": ["viewer"], "colour": "red"})
    joined = "\n".join(errors)
    for field in ("approval_policy.mode", "approval_policy.expires_in_seconds", "approval_policy.approver_roles", "approval_policy.colour"):
        assert field in joined
    assert "approval_policy.condition" in "\n".join(policy_errors({"mode": "condition"}))


def test_who_may_decide_follows_the_role_in_the_requests_tenant() -> None:
    request = ApprovalRequest(tenant_id=7, approver_roles=["approver", "owner"])
    assert may_decide(Actor(roles={7: "approver"}), request)
    assert may_decide(Actor(roles={7: "owner"}), request)
    assert not may_decide(Actor(roles={7: "operator"}), request)
    assert not may_decide(Actor(roles={7: "viewer"}), request)
    assert not may_decide(Actor(roles={8: "approver"}), request)
    assert may_decide(Actor(is_superuser=True), request)
