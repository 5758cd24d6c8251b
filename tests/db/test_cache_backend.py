"""The cache backend with Redis: django-redis, as shipped (docs/decisions/cache-backend.md; issue #51).

It replaced a subclass of Django's own Redis backend that set its private client class to reuse one redis-py client
per pool. These pin what the app relies on: one client reused by every call, keys and values that Django's own backend
reads and writes alike (a rolling deploy, or a move back), the API key cache's stamp and the job locks' ``add`` on it,
and an outage still recognised as Redis being down (tenants/keycache.py, core/joblock.py read it so).
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import pytest
from django.core.cache import cache
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache

from core.outages import REDIS, dependency_down

REDIS_URL = os.environ.get("REDIS_URL", "")
pytestmark = pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL (the cache is process memory without it)")


def test_the_cache_is_django_redis_with_one_client_reused_by_every_call() -> None:
    from django.core.cache import caches
    from django_redis import get_redis_connection
    from django_redis.cache import RedisCache

    assert isinstance(caches["default"], RedisCache)
    assert get_redis_connection("default") is get_redis_connection("default")  # not one redis.Redis per operation
    key = f"test-cache-{uuid.uuid4().hex}"
    assert cache.add(key, "first", timeout=30) and not cache.add(key, "second", timeout=30)  # the job locks' add
    assert cache.get(key) == "first"
    cache.delete(key)
    assert cache.get(key) is None


def test_keys_and_values_are_those_of_djangos_own_backend() -> None:
    """What one backend writes the other reads, under the same KEY_PREFIX: processes of both kinds may share Redis."""
    from django.conf import settings

    config = settings.CACHES["default"]
    django_own = DjangoRedisCache(config["LOCATION"], {"KEY_PREFIX": config["KEY_PREFIX"]})
    values: list[Any] = ["0123456789abcdef", 42, {"a": [1, 2]}, None, True]
    for value in values:
        key = f"test-cache-{uuid.uuid4().hex}"
        django_own.set(key, value, timeout=30)
        assert cache.get(key, "missing") == value
        cache.set(key, [value], timeout=30)
        assert django_own.get(key) == [value]
        cache.delete(key)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_outage_is_still_recognised_as_redis_being_down() -> None:
    """django-redis raises its ConnectionInterrupted from redis-py's ConnectionError: ``dependency_down`` follows the
    cause, so the API key cache bypasses itself (and an API call answers 503 ``dependency_unavailable``) as before."""
    from django_redis.cache import RedisCache

    down = RedisCache(f"redis://127.0.0.1:{_closed_port()}/0",
                      {"KEY_PREFIX": "agentops", "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1}})
    for call in (lambda: down.get("stamp"), lambda: down.add("lock", "token", timeout=5), lambda: down.set("s", "t")):
        with pytest.raises(Exception) as caught:
            call()
        assert dependency_down(caught.value) == REDIS, repr(caught.value)


def test_the_key_cache_reads_its_stamp_through_the_backend_and_survives_its_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_redis.cache import RedisCache

    from tenants import keycache

    stamp = keycache.current_stamp()
    assert stamp is not None and keycache.current_stamp() == stamp
    down = RedisCache(f"redis://127.0.0.1:{_closed_port()}/0",
                      {"KEY_PREFIX": "agentops", "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1}})
    monkeypatch.setattr(keycache, "cache", down)
    monkeypatch.setattr(keycache, "_redis_down_until", 0.0)
    assert keycache.current_stamp() is None  # bypassed: keys are read from the database meanwhile
