"""Issue #49, hole 2: a request waiting on a server a tenant chose holds no database connection, and a tenant has at
most REMOTE_CALLS_PER_TENANT such requests under way (core/remote_waits.py).

The servers are slow on purpose (tests/support/slow_remote.py): each holds its callers until the test opens its gate,
and the test looks at the waiting requests' connections (and, on PostgreSQL, the pool) meanwhile."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from rest_framework.test import APIClient

from approvals.models import NotificationChannel
from core.remote_waits import remote_wait
from tenants.models import Tenant
from tests.factories import World, make_world
from tests.support.clients import bearer_client
from tests.support.slow_remote import GatedHttp, GatedMcpServer, Request
from tools.models import Tool, ToolKind

pytestmark = pytest.mark.django_db(transaction=True)  # requests on threads of their own, each with its connection

MODELS = {"gpt-4o-mini": {"context_window": 128000, "price_in_per_1m": 0.15, "price_out_per_1m": 0.6}}
MODEL_LIST = json.dumps({"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model", "created": 0,
                                                     "owned_by": "fake"}]}).encode()


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    """The slow servers listen on 127.0.0.1, which the egress guard refuses unless allowed."""
    settings.TOOL_EGRESS_ALLOW = ["127.0.0.1"]
    settings.PROVIDER_EGRESS_ALLOW = ["127.0.0.1"]


def _pool() -> Any:
    return connection.pool if connection.vendor == "postgresql" else None


def _pool_size() -> int:
    pool = _pool()
    return pool.max_size if pool is not None else 10  # SQLite has no pool: as many as PostgreSQL's default


def _lent() -> int | None:
    """Connections of the pool lent out now (None without a pool)."""
    pool = _pool()
    if pool is None:
        return None
    stats = pool.get_stats()
    return int(stats["pool_size"] - stats["pool_available"])


def _import(world: World, url: str, prefix: str) -> Request:
    return Request(lambda: bearer_client(world.raw_key).post(
        "/api/v1/tools/import-mcp", {"server": {"url": url, "timeout": 20}, "prefix": prefix}, format="json"))


def test_slow_imports_past_the_pool_size_hold_no_connection_and_another_tenant_is_answered(settings: Any) -> None:
    importer, other = make_world(), make_world()
    count = _pool_size() + 1  # one more than the pool could lend, had each waiting import kept its connection
    settings.REMOTE_CALLS_PER_TENANT = count
    with GatedMcpServer() as server:
        # given more imports of a slow MCP server than the pool has connections, all waiting on it
        imports = [_import(importer, server.url, f"s{i}_") for i in range(count)]
        waiting = server.wait_for(count, timeout=20)
        holding = sum(1 for request in imports if request.holds_connection())
        lent = _lent()
        # when another tenant reads its tools meanwhile
        started = time.monotonic()
        reply = Request(lambda: bearer_client(other.raw_key).get("/api/v1/tools")).result()
        took = time.monotonic() - started
        server.open()
        results = [request.result() for request in imports]
    # then every import reached the server without waiting for a connection, none held one while it waited,
    assert waiting >= count, f"only {waiting} of {count} imports reached the server: the others waited for a connection"
    assert holding == 0, f"{holding} of {count} imports held a database connection while they waited on the server"
    assert lent is None or lent <= 1, f"{lent} pooled connections were lent out during the wait (the test's own: 1)"
    # the other tenant was answered at once, and each import then wrote its tools
    assert reply.status_code == 200, reply.content[:300]
    assert took < 3, f"the other tenant waited {took:.1f} s"
    assert [r.status_code for r in results] == [201] * count, [r.content[:200] for r in results if r.status_code != 201]
    assert Tool.objects.filter(tenant=importer.tenant, kind=ToolKind.MCP).count() == 2 * count


def test_a_tenant_past_its_share_of_remote_calls_gets_429_and_another_tenant_does_not(settings: Any) -> None:
    settings.REMOTE_CALLS_PER_TENANT = 2
    busy, other = make_world(), make_world()
    operator = APIClient()
    operator.force_authenticate(busy.operator)
    provider = operator.post("/api/v1/providers", {"name": "acme", "base_url": "http://127.0.0.1:9/v1",
                                                   "api_key": "sk-test-0123456789abcdef", "models": MODELS},
                             format="json").json()
    with GatedMcpServer() as server:
        # given a tenant with two imports waiting on a slow server
        held = [_import(busy, server.url, f"a{i}_") for i in range(2)]
        assert server.wait_for(2, timeout=20) == 2
        # when it starts a third, or tests a provider
        third = _import(busy, server.url, "c_").result(timeout=10)
        tested = Request(lambda: operator.post(f"/api/v1/providers/{provider['id']}/test")).result(timeout=10)
        # and another tenant imports meanwhile
        theirs = _import(other, server.url, "o_")
        others_arrived = server.wait_for(3, timeout=20)
        server.open()
        done = [request.result() for request in [*held, theirs]]
    # then the tenant is told to come back later, saying why; the other tenant's import went ahead
    for refused in (third, tested):
        assert refused.status_code == 429, refused.content[:300]
        assert refused["Retry-After"] == "5"
        error = refused.json()["error"]
        assert error["code"] == "throttled" and "already has 2 calls to outside servers under way" in error["message"]
    assert others_arrived == 3
    assert [r.status_code for r in done] == [201, 201, 201], [r.content[:200] for r in done]
    # and with its calls over, the tenant's slots are free again
    again = bearer_client(busy.raw_key).post("/api/v1/tools/import-mcp", {"server": {"url": server.url}, "prefix": "d_"},
                                            format="json")
    assert again.status_code != 429, again.content[:300]


@pytest.mark.parametrize("via", ["api", "admin"])
def test_a_providers_connection_test_waits_holding_no_connection(via: str) -> None:
    world = make_world()
    operator = APIClient()
    operator.force_authenticate(world.operator)
    with GatedHttp(MODEL_LIST) as fake:
        provider = operator.post("/api/v1/providers", {"name": "acme", "base_url": fake.base_url, "models": MODELS,
                                                       "api_key": "sk-test-0123456789abcdef"}, format="json").json()
        if via == "api":
            test = Request(lambda: operator.post(f"/api/v1/providers/{provider['id']}/test"))
        else:
            page = Client()
            page.force_login(world.operator)
            test = Request(lambda: page.post("/admin/agents/provider/", {"action": "test_connection",
                                                                        "_selected_action": [provider["id"]]}, follow=True))
        arrived = fake.wait_for(1, timeout=20)
        holding = test.holds_connection()
        fake.open()
        response = test.result()
    assert arrived == 1
    assert not holding, "the request held its database connection while the provider was slow to answer"
    said = response.json()["message"] if via == "api" else response.content.decode()
    assert "offers 1 model(s)" in said, said[:2000]


SLOW_HOST = "hooks.slow.example"


@pytest.fixture
def slow_dns(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """``hooks.slow.example`` resolves to a public address; each lookup of it notes whether its thread held a database
    connection (or was inside a transaction) while the tenant's DNS was asked."""
    real = socket.getaddrinfo
    held: list[bool] = []

    def lookup(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if (host.decode() if isinstance(host, bytes) else host) != SLOW_HOST:
            return real(host, port, *args, **kwargs)
        held.append(connection.connection is not None or connection.in_atomic_block)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", int(port or 443)))]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return held


@pytest.mark.parametrize("via", ["api", "admin"])
def test_a_webhooks_address_is_resolved_holding_no_connection(slow_dns: list[bool], via: str) -> None:
    world = make_world()
    first, second = (f"https://{SLOW_HOST}/services/T000/B000/{tail}" for tail in ("first0123456789abcdef", "second0123456789abcde"))
    if via == "api":
        api = bearer_client(world.raw_key)
        made = api.post("/api/v1/notification-channels", {"name": "ops", "kind": "webhook_slack", "target": first,
                                                          "events": ["arrived"]}, format="json")
        assert made.status_code == 201, made.content[:300]
        changed = api.patch(f"/api/v1/notification-channels/{made.json()['id']}", {"target": second}, format="json")
        assert changed.status_code == 200, changed.content[:300]
    else:
        page = Client()
        page.force_login(world.operator)
        form = {"tenant": world.tenant.pk, "name": "ops", "kind": "webhook_slack", "events": ["arrived"], "enabled": "on"}
        made = page.post("/admin/approvals/notificationchannel/add/", {**form, "target": first})
        assert made.status_code == 302, made.content.decode()[:2000]
        channel = NotificationChannel.objects.get(tenant=world.tenant, name="ops")
        changed = page.post(f"/admin/approvals/notificationchannel/{channel.pk}/change/", {**form, "target": second})
        assert changed.status_code == 302, changed.content.decode()[:2000]
    assert NotificationChannel.objects.get(tenant=world.tenant, name="ops").target == second
    assert slow_dns, "the webhook's host was never resolved"
    assert not any(slow_dns), f"{sum(slow_dns)} of {len(slow_dns)} lookups of the tenant's host held a database connection"


@pytest.mark.django_db
def test_inside_a_transaction_the_connection_stays_and_the_transaction_goes_on() -> None:
    with transaction.atomic():
        Tenant.objects.create(slug="kept", name="kept")
        with remote_wait(None, seconds=1, what="a check"):
            assert connection.connection is not None
        assert Tenant.objects.filter(slug="kept").exists()


def test_atomic_requests_stops_start_up_since_a_waiting_request_could_not_give_its_connection_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from config.checks import no_atomic_requests

    assert no_atomic_requests() == []
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    assert [e.id for e in no_atomic_requests()] == ["agentops.E001"]
