"""Small builders for tests: an owner tenant, a teammate and an outsider, each with what a test needs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model

from accounts import services as tenant_services
from agents.models import Agent, AgentVersion
from tenants.models import ApiKey, Role, Tenant
from tools.services import install_python_tool

ORDER_TOOLS = ["order_desk.query_order", "order_desk.query_logistics", "order_desk.sum_order_totals"]


@dataclass
class World:
    tenant: Tenant
    operator: Any
    viewer: Any
    agent: Agent
    version: AgentVersion
    key: ApiKey
    raw_key: str
    #: The tenant's owner and approver: set by ``make_team`` (the shared ``world`` fixture), None from ``make_world``.
    owner: Any = None
    approver: Any = None


def make_user(username: str | None = None, **extra: Any) -> Any:
    User = get_user_model()
    return User.objects.create_user(username=username or f"u-{uuid.uuid4().hex[:8]}", password="correct-horse-battery", **extra)


def make_world(slug: str | None = None, *, model: str = "demo/planner", max_recursion: int = 6) -> World:
    slug = slug or f"t-{uuid.uuid4().hex[:8]}"
    tenant = Tenant.objects.create(slug=slug, name=slug)
    operator = make_user(f"{slug}-operator", is_staff=True)
    viewer = make_user(f"{slug}-viewer", is_staff=True)
    tenant_services.set_membership(tenant=tenant, user=operator, role=Role.OPERATOR, actor=None)
    tenant_services.set_membership(tenant=tenant, user=viewer, role=Role.VIEWER, actor=None)
    tools = [install_python_tool(tenant=tenant, key=k, actor=None) for k in ORDER_TOOLS]
    agent = Agent.objects.create(tenant=tenant, slug="order-assistant", name="Order assistant")
    version = AgentVersion.objects.create(tenant=tenant, agent=agent, number=1, model=model,
                                          system_prompt="You answer questions about orders.",
                                          tools=[t.name for t in tools], policy={"limits": {"max_recursion": max_recursion}})
    agent.current_version = version
    agent.save(update_fields=["current_version"])
    key, raw = tenant_services.create_api_key(tenant=tenant, name="test", owner=operator, role=Role.OPERATOR, actor=None)
    return World(tenant, operator, viewer, agent, version, key, raw)


def make_team(slug: str | None = None) -> World:
    """``make_world`` and the rest of the team: an owner and an approver (staff, as the others), so a tenant has one
    member of every role."""
    world = make_world(slug)
    for role in (Role.OWNER, Role.APPROVER):
        user = make_user(f"{world.tenant.slug}-{role}", is_staff=True)
        tenant_services.set_membership(tenant=world.tenant, user=user, role=role, actor=None)
        setattr(world, str(role), user)
    return world


def csrf_client(user: Any) -> Any:
    """A browser-like test client logged in as ``user`` that checks CSRF tokens as the real pages do."""
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client
