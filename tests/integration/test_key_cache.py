"""Issue #14, goal 2, across processes: the server caches API keys, yet a change made in another process (here the
test's, as the admin or a management command would) applies to the server's very next request.

In production mode the server's key cache is on and its invalidation stamp is in Redis; in embedded mode the cache is
off (process memory reaches no other process) and the same answers must come from the database.
"""

from __future__ import annotations

from typing import Any

import pytest

from accounts import services as tenant_services
from tenants.models import Membership, Role
from tests.factories import World, make_world
from tests.support.live_stack import LiveStack

pytestmark = pytest.mark.integration

RUN = {"agent": "order-assistant", "input": "where is order O202411280001?"}


def _warm(stack: LiveStack, key: str) -> None:
    with stack.client(key) as http:
        for _ in range(3):  # the server has the key cached (production mode)
            assert http.get("/api/v1/runs").status_code == 200


def test_a_key_revoked_in_another_process_is_refused_on_the_servers_next_request(live_stack: LiveStack,
                                                                                unblocked_db: None) -> None:
    world: World = make_world()
    _warm(live_stack, world.raw_key)
    tenant_services.revoke_api_key(key=world.key, actor=None)
    with live_stack.client(world.raw_key) as http:
        refused = http.get("/api/v1/runs")
    assert refused.status_code == 401, refused.text


def test_a_role_change_and_a_removal_in_another_process_apply_on_the_servers_next_request(live_stack: LiveStack,
                                                                                         unblocked_db: Any) -> None:
    world: World = make_world()
    _warm(live_stack, world.raw_key)
    tenant_services.set_membership(tenant=world.tenant, user=world.operator, role=Role.VIEWER, actor=None)
    with live_stack.client(world.raw_key) as http:
        assert http.post("/api/v1/runs", json=RUN).status_code == 403
        assert http.get("/api/v1/runs").status_code == 200
    tenant_services.remove_membership(membership=Membership.objects.get(user=world.operator, tenant=world.tenant),
                                      actor=None)
    with live_stack.client(world.raw_key) as http:
        refused = http.get("/api/v1/runs")
    assert refused.status_code == 401 and "owner no longer has access" in refused.json()["detail"]
