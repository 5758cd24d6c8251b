"""Streams open at once, bounded per API key (or signed-in user) and per tenant (issue #49: one key held 195).

A run's event stream (SSE) and its trace websocket hold a *slot* while they are open: :func:`hold` takes one of the
caller's ``MAX_OPEN_STREAMS_PER_KEY`` and one of its tenant's ``MAX_OPEN_STREAMS_PER_TENANT`` together, or neither
(:class:`TooManyStreams`: a 429 with ``Retry-After`` over HTTP, close code 4429 on a websocket). A slot is given back
when its stream ends (:meth:`Slot.release`).

With ``REDIS_URL`` the count is one count across every server process: a sorted set per caller and per tenant whose
members are the open slots, scored by when their lease runs out, checked and taken in one atomic script on Redis's
clock. A stream renews its lease every third of ``OPEN_STREAM_LEASE_SECONDS`` while it lives (:func:`keep`, an asyncio
task: no thread), so a server process killed with streams open leaks their slots for one lease at most. In embedded
mode (one server process) the count is in process memory, with the same leases.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from django.conf import settings

from tenants.scoping import Actor

log = logging.getLogger(__name__)

#: Seconds a refused client is told to wait: a slot frees whenever one of the caller's streams ends.
RETRY_AFTER_SECONDS = 5
#: A refused websocket's close code (4000-4999: the application's own), as HTTP's 429.
CLOSE_CODE = 4429


class TooManyStreams(Exception):
    """No slot: the caller (``scope`` "key") or its tenant (``scope`` "tenant") has ``bound`` streams open."""

    def __init__(self, scope: str, bound: int, caller: str) -> None:
        self.scope, self.bound = scope, bound
        whose = "this tenant" if scope == "tenant" else f"this {'API key' if caller.startswith('key:') else 'user'}"
        across = " across its API keys and users" if scope == "tenant" else ""
        self.message = (f"Too many open streams for {whose}: {bound} streams are open{across}, the most allowed at "
                        "once. Close one (or let one end) and retry.")
        super().__init__(self.message)
        #: For a websocket's close frame, which holds at most 123 bytes.
        self.reason = f"too many open streams for {whose} ({bound})"


def caller(actor: Actor) -> str:
    """Whose streams these are: the API key (by its prefix) or the signed-in user; as the API's rate limits count."""
    if actor.api_key is not None:
        return f"key:{actor.api_key.prefix}"
    return f"user:{actor.user_id}"


class Store(Protocol):
    def take(self, token: str, keys: list[str], bounds: list[int], lease: float) -> int:
        """Add ``token`` to every key's set if each holds fewer live members than its bound; else the index + 1 of
        the first that is full (0: taken)."""
        ...

    def renew(self, token: str, keys: list[str], lease: float) -> None: ...

    def drop(self, token: str, keys: list[str]) -> None: ...


class LocalStore:
    """This process's slots (embedded mode)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._sets: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def _live(self, key: str, now: float) -> dict[str, float]:
        members = self._sets.setdefault(key, {})
        for token in [t for t, until in members.items() if until <= now]:
            del members[token]
        return members

    def take(self, token: str, keys: list[str], bounds: list[int], lease: float) -> int:
        with self._lock:
            now = self._clock()
            sets = [self._live(key, now) for key in keys]
            for index, (members, bound) in enumerate(zip(sets, bounds, strict=True)):
                if len(members) >= bound:
                    return index + 1
            for members in sets:
                members[token] = now + lease
            return 0

    def renew(self, token: str, keys: list[str], lease: float) -> None:
        with self._lock:
            now = self._clock()
            for key in keys:
                self._sets.setdefault(key, {})[token] = now + lease

    def drop(self, token: str, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                members = self._sets.get(key, {})
                members.pop(token, None)
                if not members:
                    self._sets.pop(key, None)


_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  if redis.call('ZCARD', KEYS[i]) >= tonumber(ARGV[2 + i]) then return i end
end
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[i], lease)
end
return 0
"""

#: Also puts back a slot whose lease ran out meanwhile (the process was stalled): the stream is alive.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[i], lease)
end
return 0
"""


class RedisStore:
    """Slots in Redis, shared by every server process (leases in milliseconds on Redis's clock)."""

    def __init__(self, client: Any, prefix: str = "agentops:streams:") -> None:
        self._client = client
        self.prefix = prefix
        self._take = client.register_script(_TAKE)
        self._renew = client.register_script(_RENEW)

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        import redis

        # Short scripts only: a tight read timeout, so a hung Redis fails the request fast (a 503, core/outages.py).
        return cls(redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=30))

    def take(self, token: str, keys: list[str], bounds: list[int], lease: float) -> int:
        return int(self._take(keys=[self.prefix + k for k in keys], args=[token, int(lease * 1000), *bounds]))

    def renew(self, token: str, keys: list[str], lease: float) -> None:
        self._renew(keys=[self.prefix + k for k in keys], args=[token, int(lease * 1000)])

    def drop(self, token: str, keys: list[str]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.zrem(self.prefix + key, token)
        pipe.execute()


_lock = threading.Lock()
_store: Store | None = None


def store() -> Store:
    """One store per process: Redis when configured, else process memory."""
    global _store
    with _lock:
        if _store is None:
            _store = RedisStore.from_url(settings.REDIS_URL) if settings.REDIS_URL else LocalStore()
        return _store


class Slot:
    """One open stream's place in its caller's and tenant's counts; :meth:`release` is safe to call more than once."""

    def __init__(self, token: str, keys: list[str], lease: float) -> None:
        self.token, self.keys, self.lease = token, keys, lease
        self._released = False

    def renew(self) -> None:
        if not self._released and self.keys:
            store().renew(self.token, self.keys, self.lease)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if not self.keys:
            return
        try:
            store().drop(self.token, self.keys)
        except Exception:  # Redis is down: the slot's lease runs out on its own
            log.warning("open streams: could not give back a slot; it lapses within %ss", self.lease, exc_info=True)


def hold(caller: str, tenant_id: int, lease: float | None = None) -> Slot:
    """A slot for one more stream of ``caller`` in the tenant, or :class:`TooManyStreams` (nothing taken)."""
    bounded = [(f"caller:{caller}", settings.MAX_OPEN_STREAMS_PER_KEY, "key"),
               (f"tenant:{tenant_id}", settings.MAX_OPEN_STREAMS_PER_TENANT, "tenant")]
    bounded = [entry for entry in bounded if entry[1] > 0]  # a bound of 0: that one is not counted
    lease = float(settings.OPEN_STREAM_LEASE_SECONDS if lease is None else lease)
    slot = Slot(uuid.uuid4().hex, [key for key, _, _ in bounded], lease)
    if not bounded:
        return slot
    full = store().take(slot.token, slot.keys, [bound for _, bound, _ in bounded], lease)
    if full:
        _, bound, scope = bounded[full - 1]
        raise TooManyStreams(scope, bound, caller)
    return slot


async def keep(slot: Slot) -> None:
    """Renew ``slot``'s lease every third of it until cancelled (when its stream ends); each renewal is one short
    Redis call on a pooled thread. A failed renewal is logged and tried again at the next."""
    while True:
        await asyncio.sleep(slot.lease / 3)
        try:
            await sync_to_async(slot.renew, thread_sensitive=False)()
        except Exception:
            log.warning("open streams: could not renew a slot's lease", exc_info=True)
