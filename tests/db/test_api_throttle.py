"""Issue 11, hole 6 (API): each API key has a request budget, and run creation a budget of its own; 429 + Retry-After."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework.test import APIClient

from accounts import services as tenant_services
from config.env import env_rate
from core import buckets
from tenants import throttles
from tests.factories import World, make_world
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db

RUN = {"agent": "order-assistant", "input": "where is order O202411280001?"}


@pytest.fixture(autouse=True)
def _fresh_counters(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    cache.clear()  # with REDIS_URL: the same Redis database as the buckets, emptied
    monkeypatch.setattr(buckets, "_store", None)  # embedded: a new in-memory store
    yield
    cache.clear()


def _rates(**rates: str | None) -> Any:
    """Tiny rates for a test. DRF reloads its settings on the change; our throttles read the rates per request."""
    current = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    return override_settings(REST_FRAMEWORK={**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {**current, **rates}})


def _api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _throttled(response: Any) -> None:
    assert response.status_code == 429, response.content
    assert int(response["Retry-After"]) > 0
    assert "throttled" in response.json()["detail"].lower()


def test_run_creation_has_its_own_rate_per_key_and_other_tenants_are_not_affected() -> None:
    mine, other = make_world(), make_world()
    api = _api(mine)
    with _rates(run_create="2/min"):
        # given a key that used its run-creation budget
        assert [api.post("/api/v1/runs", RUN, format="json").status_code for _ in range(2)] == [202, 202]
        # when it starts one more run, then it is told to wait
        _throttled(api.post("/api/v1/runs", RUN, format="json"))
        # and it may still read (the API-wide budget is separate); another tenant's key still starts runs
        assert api.get("/api/v1/runs").status_code == 200
        assert _api(other).post("/api/v1/runs", RUN, format="json").status_code == 202


def test_every_api_request_spends_the_keys_api_budget() -> None:
    mine, other = make_world(), make_world()
    api = _api(mine)
    with _rates(api="3/min"):
        assert [api.get("/api/v1/agents").status_code for _ in range(3)] == [200, 200, 200]
        _throttled(api.get("/api/v1/runs"))
        _throttled(api.post("/api/v1/runs", RUN, format="json"))
        assert _api(other).get("/api/v1/agents").status_code == 200


def test_a_second_key_of_the_same_tenant_has_its_own_budget() -> None:
    world = make_world()
    _key, second = tenant_services.create_api_key(tenant=world.tenant, name="second", owner=world.operator, actor=None)
    with _rates(run_create="1/min"):
        assert _api(world).post("/api/v1/runs", RUN, format="json").status_code == 202
        _throttled(_api(world).post("/api/v1/runs", RUN, format="json"))
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {second}")
        assert client.post("/api/v1/runs", RUN, format="json").status_code == 202


def test_a_session_user_is_throttled_by_user_not_address() -> None:
    world = make_world()
    operator, viewer = APIClient(), APIClient()
    operator.force_login(world.operator)
    viewer.force_login(world.viewer)
    with _rates(api="2/min"):
        assert [operator.get("/api/v1/runs").status_code for _ in range(2)] == [200, 200]
        _throttled(operator.get("/api/v1/runs"))
        assert viewer.get("/api/v1/runs").status_code == 200  # same address, another user


def test_rates_come_from_the_environment_and_a_bad_one_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUN_CREATE_THROTTLE_RATE", "50/hour")
    assert env_rate("RUN_CREATE_THROTTLE_RATE", "300/min") == "50/hour"
    monkeypatch.setenv("RUN_CREATE_THROTTLE_RATE", "off")
    assert env_rate("RUN_CREATE_THROTTLE_RATE", "300/min") is None
    monkeypatch.setenv("RUN_CREATE_THROTTLE_RATE", "lots")
    with pytest.raises(ImproperlyConfigured, match="RUN_CREATE_THROTTLE_RATE"):
        env_rate("RUN_CREATE_THROTTLE_RATE", "300/min")


def test_a_refused_request_spends_nothing_of_its_other_budget() -> None:
    api = _api(make_world())
    with _rates(api="3/min", run_create="1/min"):
        assert api.post("/api/v1/runs", RUN, format="json").status_code == 202  # api 2 left, run_create 0
        _throttled(api.post("/api/v1/runs", RUN, format="json"))  # refused by run_create: api still 2
        assert [api.get("/api/v1/runs").status_code for _ in range(2)] == [200, 200]
        _throttled(api.get("/api/v1/runs"))


def test_both_budgets_of_a_request_are_taken_in_one_call_to_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    store = buckets.bucket_store()
    calls: list[list[str]] = []

    def take(taken: list[Any]) -> tuple[float, int]:
        calls.append([b.key.split(":")[1] for b in taken])
        return type(store).take(store, taken)

    monkeypatch.setattr(store, "take", take)
    api = _api(make_world())
    assert api.post("/api/v1/runs", RUN, format="json").status_code == 202
    assert api.get("/api/v1/runs").status_code == 200
    assert calls == [["api", "run_create"], ["api"]]  # one round trip per request (with Redis: one script call)


def test_concurrent_requests_never_lose_each_others_count() -> None:
    """Forty callers at once against a budget of 15 (the old read-modify-write of a pickled list let more through)."""
    world = make_world()
    request = SimpleNamespace(auth=world.key, user=world.operator)
    view = SimpleNamespace(action="list")
    start = threading.Barrier(8)

    def caller(_: int) -> list[bool]:
        start.wait()
        return [throttles.CallerThrottle().allow_request(request, view) for _ in range(5)]

    with _rates(api="15/min"), ThreadPoolExecutor(8) as pool:
        allowed = [ok for results in pool.map(caller, range(8)) for ok in results]
    assert allowed.count(True) == 15 and allowed.count(False) == 25
