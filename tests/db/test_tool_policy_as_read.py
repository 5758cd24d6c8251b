"""A tool's policy decided from the row its caller read just before the call (``tool_allowed_for(as_read=True)``):
the same answer as the policy read, in every state the policy knows, with no statement of its own; a tool read
without its install, plugin and rollout is read again rather than guessed (marketplace/access.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts import services as tenant_services
from agents.hooks import callable_tools, tool_allowed_as_read
from marketplace.access import tool_allowed_for
from marketplace.installs import disable_plugin, enable_plugin, install_plugin
from marketplace.rollouts import set_tool_rollout
from tenants.models import Role
from tenants.scoping import actor_for_user
from tests.factories import World, make_user, make_world
from tools.models import Tool
from tools.services import set_tool_enabled

pytestmark = pytest.mark.django_db

SESSIONS = [f"session-{i}" for i in range(60)]


def _decisions(world: World, name: str) -> tuple[list[tuple[bool, str]], list[tuple[bool, str]], int]:
    """(as read, by the policy read, statements the as-read decisions took) for every session."""
    [read] = list(callable_tools(world.tenant.pk).filter(name=name))
    with CaptureQueriesContext(connection) as queries:
        ours = [tool_allowed_as_read(read, world.tenant.pk, s) for s in SESSIONS]
    theirs = [tool_allowed_for(Tool.objects.get(pk=read.pk), world.tenant.pk, s) for s in SESSIONS]
    return ours, theirs, len(queries)


def test_the_tenant_s_own_tool_in_every_state_of_its_policy(world: World) -> None:
    actor = actor_for_user(world.operator)
    tool = Tool.objects.get(tenant=world.tenant, name="query_order")
    states: list[tuple[str, Any]] = [
        ("released to every session", lambda: None),
        ("rolled out to half the sessions", lambda: set_tool_rollout(tool=tool, enabled_percent=50, actor=actor)),
        ("rolled out to none", lambda: set_tool_rollout(tool=tool, enabled_percent=0, actor=actor)),
        ("switched off", lambda: set_tool_enabled(tool=tool, enabled=False, actor=actor)),
        ("switched on, rollout removed", lambda: (set_tool_enabled(tool=tool, enabled=True, actor=actor),
                                                  set_tool_rollout(tool=tool, enabled_percent=None, actor=actor))),
    ]
    seen = set()
    for label, change in states:
        change()
        ours, theirs, statements = _decisions(world, "query_order")
        assert ours == theirs, label
        assert statements == 0, f"{label}: {statements} statements to decide from the row already read"
        seen.add(tuple(allowed for allowed, _ in ours))
    assert (True,) * len(SESSIONS) in seen and (False,) * len(SESSIONS) in seen
    assert any(len(set(s)) == 2 for s in seen), "the half rollout splits the sessions"


def test_a_plugin_s_tool_while_its_install_is_enabled_and_disabled(world: World) -> None:
    owner = make_user()
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    install = install_plugin(tenant=world.tenant, plugin_key="order-desk", actor=actor_for_user(owner))
    name = Tool.objects.filter(plugin_install=install).values_list("name", flat=True).first()
    assert name is not None
    ours, theirs, statements = _decisions(world, name)
    assert ours == theirs and all(allowed for allowed, _ in ours) and statements == 0
    # disabled: a read made now does not resolve it at all, and the policy read refuses it
    disable_plugin(install=install, actor=actor_for_user(owner))
    assert not list(callable_tools(world.tenant.pk).filter(name=name)), "a disabled plugin's tool is not callable"
    allowed, reason = tool_allowed_for(Tool.objects.get(tenant=world.tenant, name=name), world.tenant.pk, SESSIONS[0])
    assert not allowed and "not enabled" in reason
    enable_plugin(install=install, actor=actor_for_user(owner))
    ours, theirs, _ = _decisions(world, name)
    assert ours == theirs and all(allowed for allowed, _ in ours)


def test_a_tool_read_without_its_relations_is_read_again_not_guessed(world: World) -> None:
    actor = actor_for_user(world.operator)
    tool = Tool.objects.get(tenant=world.tenant, name="query_order")
    set_tool_enabled(tool=tool, enabled=False, actor=actor)
    bare = Tool.objects.get(pk=tool.pk)  # no install, plugin or rollout with it
    bare.enabled = True  # what a stale instance might say: the policy read decides, not this attribute
    with CaptureQueriesContext(connection) as queries:
        allowed, reason = tool_allowed_for(bare, world.tenant.pk, SESSIONS[0], as_read=True)
    assert not allowed and "switched off" in reason
    assert len(queries) == 1
    other = make_world()
    [read] = list(callable_tools(world.tenant.pk).filter(name="query_order"))
    assert not tool_allowed_as_read(read, other.tenant.pk, SESSIONS[0])[0], "never another tenant's tool"
