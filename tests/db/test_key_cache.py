"""Issue #14, goal 2: an API key seen before costs no query, yet any change to its access applies on the next request.

The cache is on here whatever the run mode (in-process, one process: Django's local-memory cache carries the stamp
in embedded mode, Redis in production); tests/integration/test_key_cache.py checks it across processes.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts import services as tenant_services
from tenants import keycache
from tenants.auth import find_api_key
from tenants.models import ApiKey, Membership, Role
from tests.factories import World
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db

RUN = {"agent": "order-assistant", "input": "where is order O202411280001?"}


@pytest.fixture(autouse=True)
def key_cache(settings: Any) -> Any:
    settings.API_KEY_CACHE_SECONDS = 30
    keycache._entries.clear()
    yield
    keycache._entries.clear()


def _api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _key_queries(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries if "tenants_apikey" in q["sql"] or "tenants_membership" in q["sql"]]


def test_a_key_seen_before_is_checked_without_a_query(world: World) -> None:
    api = _api(world)
    assert api.get("/api/v1/runs").status_code == 200  # given the key was used once
    with CaptureQueriesContext(connection) as queries:
        key = find_api_key(world.raw_key)
    assert key is not None and len(queries) == 0
    assert key.pk == world.key.pk and key.tenant == world.tenant and key.created_by == world.operator
    assert key.owner_role == Role.OPERATOR and key.tenant.settings == world.tenant.settings
    # a fresh object each time: one request's changes to it never reach another's
    assert find_api_key(world.raw_key) is not key
    with CaptureQueriesContext(connection) as queries:
        assert api.get("/api/v1/runs").status_code == 200
    assert _key_queries(queries) == []


def test_last_used_is_recorded_but_not_written_on_every_request(world: World) -> None:
    api = _api(world)
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            assert api.get("/api/v1/runs").status_code == 200
    writes = [q for q in _key_queries(queries) if q.startswith("UPDATE")]
    assert len(writes) == 1, writes
    assert ApiKey.objects.get(pk=world.key.pk).last_used_at is not None


def test_a_revoked_key_is_refused_on_the_next_request(world: World) -> None:
    api = _api(world)
    assert api.get("/api/v1/runs").status_code == 200
    tenant_services.revoke_api_key(key=world.key, actor=None)
    assert api.get("/api/v1/runs").status_code == 401


def test_a_downgraded_owner_s_key_loses_the_rights_on_the_next_request(world: World) -> None:
    api = _api(world)
    assert api.post("/api/v1/runs", RUN, format="json").status_code == 202
    tenant_services.set_membership(tenant=world.tenant, user=world.operator, role=Role.VIEWER, actor=None)
    assert api.post("/api/v1/runs", RUN, format="json").status_code == 403
    assert api.get("/api/v1/runs").status_code == 200


def test_a_removed_owner_s_key_is_refused_on_the_next_request(world: World) -> None:
    api = _api(world)
    assert api.get("/api/v1/runs").status_code == 200
    membership = Membership.objects.get(user=world.operator, tenant=world.tenant)
    tenant_services.remove_membership(membership=membership, actor=None)
    assert api.get("/api/v1/runs").status_code == 401


def test_a_deactivated_tenant_s_key_is_refused_on_the_next_request(world: World) -> None:
    api = _api(world)
    assert api.get("/api/v1/runs").status_code == 200
    tenant_services.update_tenant(tenant=world.tenant, actor=None, is_active=False)
    assert api.get("/api/v1/runs").status_code == 401


def test_a_deactivated_owner_s_key_is_refused_on_the_next_request(world: World) -> None:
    api = _api(world)
    assert api.get("/api/v1/runs").status_code == 200
    world.operator.is_active = False  # Django's own user admin does this; no service of ours is involved
    world.operator.save()
    assert api.get("/api/v1/runs").status_code == 401


def test_a_login_or_a_key_s_use_voids_nothing(world: World) -> None:
    assert _api(world).get("/api/v1/runs").status_code == 200
    stamp = keycache.current_stamp()
    world.viewer.save(update_fields=["last_login"])
    world.key.touch()
    assert keycache.current_stamp() == stamp
    world.viewer.save()
    assert keycache.current_stamp() != stamp


def test_while_the_stamp_cannot_be_read_keys_come_from_the_database(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    api = _api(world)
    assert api.get("/api/v1/runs").status_code == 200

    def down(*args: Any, **kwargs: Any) -> Any:
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(keycache, "_redis_down_until", 0.0)
    monkeypatch.setattr(cache, "get", down)
    monkeypatch.setattr(cache, "set", down)
    # given Redis went away after the key was cached; when it is revoked meanwhile, then it is refused all the same
    tenant_services.revoke_api_key(key=world.key, actor=None)
    with CaptureQueriesContext(connection) as queries:
        assert find_api_key(world.raw_key) is None
    assert _key_queries(queries) != []
    assert keycache._entries == {}
