"""Waiting on a server a tenant chose, from a request: holding no database connection, a few per tenant at a time.

Importing an MCP server's tools, a provider's "test connection" and a webhook channel's save (its host is resolved)
wait on a server the tenant named (issue #49, hole 2). A request holds the pooled connection it borrowed for its
first query until it ends, so DB_POOL_MAX_SIZE imports of a slow server took every connection of the process and
every other tenant was answered 503 for as long as that server took. A service wraps such a wait in :func:`remote_wait`:

- it takes one of the tenant's ``REMOTE_CALLS_PER_TENANT`` slots (default 2), or is refused at once
  (:class:`RemoteCallsBusy`: 429 with ``Retry-After``), so one tenant cannot hold the server's threads either;
- it gives this thread's database connections back (``connection.close()``: Django's pool takes the connection
  back, SQLite's is closed), so the wait holds none; the first query after it borrows one again (Django connects on
  demand), which is where the service writes what it learnt, in a short transaction of its own.

A connection inside a transaction cannot be given back without ending the transaction, so there it stays: services
call this outside any (``ATOMIC_REQUESTS`` is off; a test's own transaction keeps its connection).

The slots live in Redis with ``REDIS_URL`` (one count across every server process: a sorted set per tenant, each
holder scored with the time its call must be over by, so the slot of a process killed mid-call frees itself), in
process memory in embedded mode, and in process memory too while Redis cannot be reached (a warning is logged).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import connections

from core.errors import DomainError

log = logging.getLogger(__name__)

#: What a refused request is told to wait before it tries again (the calls it waits for are seconds long).
RETRY_AFTER_SECONDS = 5
#: Added to a call's own bound for how long its Redis slot outlives a process that died holding it.
SLOT_GRACE_SECONDS = 30.0


class RemoteCallsBusy(DomainError):
    """The tenant already has its share of calls to outside servers under way (429, ``Retry-After``)."""

    code = "throttled"
    status = 429

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(RETRY_AFTER_SECONDS)}


def release_connections() -> None:
    """Give this thread's database connections back (to the pool, or closed), except one inside a transaction."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


def limit() -> int:
    return int(settings.REMOTE_CALLS_PER_TENANT)


@contextmanager
def remote_wait(tenant_id: int | None, *, seconds: float, what: str) -> Iterator[None]:
    """Around a wait on a tenant's server that ends within ``seconds`` (the call's own bound): the tenant's slot (or
    :class:`RemoteCallsBusy`), and no database connection held. ``tenant_id`` None: a shared (platform) provider."""
    key = f"{settings.CELERY_TASK_DEFAULT_QUEUE}:{'shared' if tenant_id is None else tenant_id}"
    slot = _slots().take(key, limit(), seconds + SLOT_GRACE_SECONDS)
    if slot is None:
        raise RemoteCallsBusy(
            f"This tenant already has {limit()} calls to outside servers under way (MCP imports, provider "
            f"tests, webhook address checks); "
            f"{what} was not started. Try again in {RETRY_AFTER_SECONDS} seconds, when one of them has finished.")
    try:
        release_connections()
        yield
    finally:
        slot.give_back()


# --------------------------------------------------------------------------- the slots


class Slot:
    def __init__(self, store: Any, key: str, token: str) -> None:
        self.store, self.key, self.token = store, key, token

    def give_back(self) -> None:
        self.store.give_back(self.key, self.token)


class LocalSlots:
    """Slots in this process's memory: held until given back (a thread of this process always gives its slot back)."""

    def __init__(self) -> None:
        self._held: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, limit: int, ttl: float) -> Slot | None:
        with self._lock:
            held = self._held.setdefault(key, set())
            if len(held) >= limit:
                return None
            token = uuid.uuid4().hex
            held.add(token)
        return Slot(self, key, token)

    def give_back(self, key: str, token: str) -> None:
        with self._lock:
            held = self._held.get(key, set())
            held.discard(token)
            if not held:
                self._held.pop(key, None)


_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], math.ceil((tonumber(last[2]) - now) * 1000) + 1000)
return 1
"""


class RedisSlots:
    """Slots in Redis, one count per tenant across every process; a slot not given back expires at its deadline."""

    prefix = "agentops:remote-calls:"

    def __init__(self, client: Any, fallback: LocalSlots) -> None:
        self._client = client
        self._script = client.register_script(_TAKE)
        self._fallback = fallback

    @classmethod
    def from_url(cls, url: str, fallback: LocalSlots) -> RedisSlots:
        import redis

        return cls(redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=30), fallback)

    def take(self, key: str, limit: int, ttl: float) -> Slot | None:
        import redis

        token = uuid.uuid4().hex
        try:
            taken = self._script(keys=[self.prefix + key], args=[limit, repr(float(ttl)), token])
        except redis.RedisError as exc:  # Redis down: this process still bounds its own calls
            log.warning("remote call slots kept in process memory: Redis could not be reached (%s)", type(exc).__name__)
            return self._fallback.take(key, limit, ttl)
        return Slot(self, key, token) if int(taken) else None

    def give_back(self, key: str, token: str) -> None:
        import redis

        try:
            self._client.zrem(self.prefix + key, token)
        except redis.RedisError as exc:  # it expires at its deadline
            log.warning("a remote call slot could not be given back (%s); it expires by itself", type(exc).__name__)


_lock = threading.Lock()
_store: LocalSlots | RedisSlots | None = None
_local = LocalSlots()


def _slots() -> LocalSlots | RedisSlots:
    """One store per process: Redis when configured, else process memory."""
    global _store
    with _lock:
        if _store is None:
            url = getattr(settings, "REDIS_URL", None)
            _store = RedisSlots.from_url(url, _local) if url else _local
        return _store
