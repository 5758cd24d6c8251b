"""Issue 11, hole 5: an API key never does more than its owner may do in its tenant today.

A key's effective role is the lower of its own role and its owner's current role; an owner who left the
tenant or was deactivated takes the key's access with them, at once, over HTTP and websockets alike.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts import services as tenant_services
from config.asgi import application
from tenants.auth import load_api_key
from tenants.models import Membership, Role
from tenants.scoping import actor_for_api_key, lower_role
from tests.db.test_tools_api import HTTP_TOOL
from tests.factories import World

pytestmark = pytest.mark.django_db

RUN = {"agent": "order-assistant", "input": "where is order O202411280001?"}


def _api(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def _socket_opens(raw_key: str, run_id: Any) -> bool:
    # asgiref's communicator: channels.testing needs daphne, which the project does not install.
    scope = {"type": "websocket", "path": f"/ws/runs/{run_id}/", "query_string": b"after=0", "subprotocols": [],
             "headers": [(b"authorization", f"Bearer {raw_key}".encode())]}

    async def attempt() -> bool:
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "websocket.connect"})
        answer = await communicator.receive_output(timeout=5)
        await communicator.send_input({"type": "websocket.disconnect", "code": 1000})
        await communicator.wait(timeout=5)
        return answer["type"] == "websocket.accept"

    return async_to_sync(attempt)()


def _refused_because_owner_left(response: Any) -> None:
    assert response.status_code == 401, response.content
    assert "owner no longer has access" in response.json()["detail"]


@pytest.mark.django_db(transaction=True)  # the websocket's database_sync_to_async closes connections held in a transaction
def test_a_key_stops_working_when_its_owners_membership_is_deleted(world: World) -> None:
    # given an operator's key that lists and starts runs and watches a run's trace
    api = _api(world.raw_key)
    assert api.get("/api/v1/runs").status_code == 200
    started = api.post("/api/v1/runs", RUN, format="json")
    assert started.status_code == 202, started.content
    assert _socket_opens(world.raw_key, started.json()["id"])

    # when the operator's membership is deleted
    Membership.objects.filter(user=world.operator, tenant=world.tenant).delete()

    # then the key is refused at once, with a message saying why
    _refused_because_owner_left(api.get("/api/v1/runs"))
    _refused_because_owner_left(api.post("/api/v1/runs", RUN, format="json"))
    assert not _socket_opens(world.raw_key, started.json()["id"])


@pytest.mark.django_db(transaction=True)
def test_a_key_acts_with_its_owners_current_role_when_that_is_lower(world: World) -> None:
    # given an operator's operator-role key
    api = _api(world.raw_key)
    run_id = api.post("/api/v1/runs", RUN, format="json").json()["id"]

    # when the owner is downgraded to viewer
    tenant_services.set_membership(tenant=world.tenant, user=world.operator, role=Role.VIEWER, actor=None)

    # then the key has viewer rights only: it reads, but starts no run and creates no tool
    assert api.get("/api/v1/runs").status_code == 200
    assert api.get(f"/api/v1/runs/{run_id}").status_code == 200
    assert api.post("/api/v1/runs", RUN, format="json").status_code == 403
    assert api.post("/api/v1/tools", HTTP_TOOL, format="json").status_code == 403
    assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 403
    assert _socket_opens(world.raw_key, run_id)  # viewers may watch


def test_a_key_never_exceeds_its_own_role_when_its_owner_is_promoted(world: World) -> None:
    _key, viewer_key = tenant_services.create_api_key(tenant=world.tenant, name="read-only", owner=world.operator,
                                                      role=Role.VIEWER, actor=None)
    tenant_services.set_membership(tenant=world.tenant, user=world.operator, role=Role.OWNER, actor=None)
    assert _api(viewer_key).post("/api/v1/runs", RUN, format="json").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_a_deactivated_owners_key_is_refused(world: World) -> None:
    api = _api(world.raw_key)
    run_id = api.post("/api/v1/runs", RUN, format="json").json()["id"]
    world.operator.is_active = False
    world.operator.save(update_fields=["is_active"])
    _refused_because_owner_left(api.get("/api/v1/runs"))
    _refused_because_owner_left(api.post("/api/v1/runs", RUN, format="json"))
    assert not _socket_opens(world.raw_key, run_id)


def test_the_gate_applies_the_rule_to_keys_loaded_any_way(world: World) -> None:
    # a key loaded without find_api_key (e.g. by a worker): the gate looks its owner's membership up itself
    assert actor_for_api_key(world.key).can("operate", world.tenant.pk)
    Membership.objects.filter(user=world.operator, tenant=world.tenant).delete()
    actor = actor_for_api_key(world.key)
    assert not actor.can("view", world.tenant.pk) and actor.tenant_ids() == []


@pytest.mark.parametrize(
    ("a", "b", "lower"),
    [("owner", "operator", "operator"), ("operator", "viewer", "viewer"), ("owner", "approver", "approver"),
     ("operator", "approver", "viewer"), ("approver", "approver", "approver")],
)
def test_the_lower_role_is_the_greatest_role_within_both(a: str, b: str, lower: str) -> None:
    assert lower_role(a, b) == lower_role(b, a) == lower


def test_the_key_lookup_is_one_unsorted_query_that_brings_the_owners_role(world: World) -> None:
    load_api_key(world.raw_key)  # the first use records last_used_at; the lookup below is the steady state
    with CaptureQueriesContext(connection) as queries:
        key = load_api_key(world.raw_key)
        assert key is not None
        actor = actor_for_api_key(key)
        assert actor.roles == {world.tenant.pk: Role.OPERATOR}
        assert key.created_by == world.operator and key.tenant == world.tenant
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert "ORDER BY" not in queries[0]["sql"]
