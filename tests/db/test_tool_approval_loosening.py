"""A tenant tool's own approval policy is a floor too: an API key (or an operator) cannot loosen it; the owner in person can."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts import services as tenant_services
from audit.models import ConfigChange
from tenants.models import Role
from tenants.scoping import actor_for_api_key, actor_for_user
from tests.factories import World, make_user, make_world
from tools.models import Tool, ToolCategory, ToolKind
from tools.services import ToolRefused, update_tool

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    world = make_world()
    Tool.objects.create(
        tenant=world.tenant, name="refund_order", kind=ToolKind.HTTP, category=ToolCategory.WRITE, idempotent=False,
        description="Refund an order.", parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
        config={"method": "POST", "url": "https://shop.example.com/refunds/{order_id}"}, requires_approval=True,
    )
    Tool.objects.create(
        tenant=world.tenant, name="wire_money", kind=ToolKind.HTTP, category=ToolCategory.WRITE, idempotent=False,
        description="Wire money.", parameters={"type": "object", "properties": {"amount": {"type": "number"}}},
        config={"method": "POST", "url": "https://bank.example.com/wires"}, approval_policy={"mode": "always", "four_eyes": True},
    )
    return world


def _as_key(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_an_operator_key_cannot_switch_a_tools_approval_off(world: World) -> None:
    response = _as_key(world.raw_key).patch("/api/v1/tools/refund_order", {"requires_approval": False}, format="json")
    assert response.status_code == 400, response.content
    assert "only the tenant's owner" in response.json()["requires_approval"][0]
    assert Tool.objects.get(tenant=world.tenant, name="refund_order").requires_approval


@pytest.mark.parametrize("policy", [
    {"mode": "never"},
    {"mode": "always"},  # drops four eyes
    {"mode": "always", "four_eyes": True, "approver_roles": ["owner", "approver", "operator"]},
    {"mode": "always", "four_eyes": True, "expires_in_seconds": 2_000_000},
])
def test_an_operator_cannot_loosen_a_tools_approval_policy_by_any_field(world: World, policy: dict[str, Any]) -> None:
    tool = Tool.objects.get(tenant=world.tenant, name="wire_money")
    with pytest.raises(ToolRefused, match="only the tenant's owner"):
        update_tool(tool=tool, actor=actor_for_api_key(world.key), approval_policy=policy)
    with pytest.raises(ToolRefused, match="only the tenant's owner"):
        update_tool(tool=tool, actor=actor_for_user(world.operator), approval_policy=policy)
    tool.refresh_from_db()
    assert tool.approval_policy == {"mode": "always", "four_eyes": True}


def test_the_owners_key_cannot_either_but_the_owner_signed_in_can_and_it_is_audited(world: World) -> None:
    owner = make_user()
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    _key, raw = tenant_services.create_api_key(tenant=world.tenant, name="owner", owner=owner, role=Role.OWNER, actor=None)
    assert _as_key(raw).patch("/api/v1/tools/refund_order", {"requires_approval": False}, format="json").status_code == 400
    session = APIClient()
    session.force_login(owner)
    response = session.patch("/api/v1/tools/refund_order", {"requires_approval": False}, format="json")
    assert response.status_code == 200, response.content
    change = ConfigChange.objects.get(tenant=world.tenant, action="tool.approval_loosened")
    assert change.actor == owner and change.details["before"]["requires_approval"] is True
    assert "approval_policy.mode" in change.details["loosened"][0]


def test_stricter_is_always_allowed(world: World) -> None:
    tool = Tool.objects.get(tenant=world.tenant, name="wire_money")
    update_tool(tool=tool, actor=actor_for_api_key(world.key),
                approval_policy={"mode": "always", "four_eyes": True, "expires_in_seconds": 60})
    assert Tool.objects.get(pk=tool.pk).approval_policy["expires_in_seconds"] == 60
    assert not ConfigChange.objects.filter(action="tool.approval_loosened").exists()
