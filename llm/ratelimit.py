"""Token-bucket rate limits, in-process or shared through Redis, behind one interface.

A call takes from several buckets at once (provider requests, provider tokens, tenant
requests, tenant tokens) all-or-nothing: if one bucket is short, none is charged and the
caller learns how long to wait. The Redis store does the same check-and-take atomically in a
Lua script using the Redis server's clock, so every worker process shares one budget.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from llm.config import RateLimit
from llm.errors import RateLimitExceededError


@dataclass(frozen=True)
class Bucket:
    """One bucket to take ``amount`` from. ``capacity`` is the burst size; ``rate`` refills per second."""

    key: str
    capacity: float
    rate: float
    amount: float
    label: str = ""


class BucketStore(Protocol):
    def take(self, buckets: list[Bucket]) -> tuple[float, int]:
        """Take every bucket's amount, or none.

        Returns ``(0, -1)`` when taken, else ``(seconds until it could be, index of the short bucket)``;
        the seconds are ``math.inf`` when an amount exceeds its bucket's capacity.
        """
        ...

    def charge(self, buckets: list[Bucket]) -> None:
        """Take amounts unconditionally (a bucket may go negative): settles estimates with actual usage."""
        ...


class LocalBucketStore:
    """Buckets in this process's memory, guarded by one lock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._state: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def _level(self, bucket: Bucket, now: float) -> float:
        tokens, at = self._state.get(bucket.key, (bucket.capacity, now))
        return min(bucket.capacity, tokens + max(0.0, now - at) * bucket.rate)

    def take(self, buckets: list[Bucket]) -> tuple[float, int]:
        with self._lock:
            now = self._clock()
            levels = [self._level(b, now) for b in buckets]
            wait, short = 0.0, -1
            for index, (bucket, level) in enumerate(zip(buckets, levels, strict=True)):
                if bucket.amount > bucket.capacity:
                    return math.inf, index
                need = (bucket.amount - level) / bucket.rate
                if need > wait:
                    wait, short = need, index
            if wait > 0:
                return wait, short
            for bucket, level in zip(buckets, levels, strict=True):
                self._state[bucket.key] = (level - bucket.amount, now)
            return 0.0, -1

    def charge(self, buckets: list[Bucket]) -> None:
        with self._lock:
            now = self._clock()
            for bucket in buckets:
                self._state[bucket.key] = (self._level(bucket, now) - bucket.amount, now)


_TAKE_SCRIPT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local force = ARGV[1] == '1'
local levels = {}
local wait = 0
local short = 0
for i = 1, #KEYS do
  local capacity = tonumber(ARGV[(i - 1) * 3 + 2])
  local rate = tonumber(ARGV[(i - 1) * 3 + 3])
  local amount = tonumber(ARGV[(i - 1) * 3 + 4])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'at')
  local tokens = tonumber(state[1]) or capacity
  local at = tonumber(state[2]) or now
  local level = math.min(capacity, tokens + math.max(0, now - at) * rate)
  levels[i] = level
  if not force then
    if amount > capacity then return 'inf:' .. i end
    if level < amount then
      local need = (amount - level) / rate
      if need > wait then
        wait = need
        short = i
      end
    end
  end
end
if wait > 0 then return tostring(wait) .. ':' .. short end
for i = 1, #KEYS do
  local capacity = tonumber(ARGV[(i - 1) * 3 + 2])
  local rate = tonumber(ARGV[(i - 1) * 3 + 3])
  local amount = tonumber(ARGV[(i - 1) * 3 + 4])
  redis.call('HSET', KEYS[i], 'tokens', tostring(levels[i] - amount), 'at', tostring(now))
  redis.call('PEXPIRE', KEYS[i], math.ceil(capacity / rate * 2000) + 1000)
end
return '0:0'
"""


class RedisBucketStore:
    """Buckets in Redis, shared by every process using the same ``prefix``."""

    def __init__(self, client: Any, *, prefix: str = "agentops:ratelimit:") -> None:
        self._client = client
        self.prefix = prefix
        self._script = client.register_script(_TAKE_SCRIPT)

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "agentops:ratelimit:") -> RedisBucketStore:
        import redis

        # Only short scripts run here (no blocking reads): a tight read timeout, so a hung Redis fails the call fast.
        return cls(redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=30), prefix=prefix)

    def _run(self, buckets: list[Bucket], force: bool) -> tuple[float, int]:
        if not buckets:
            return 0.0, -1
        keys = [self.prefix + b.key for b in buckets]
        args: list[Any] = ["1" if force else "0"]
        for bucket in buckets:
            args.extend([repr(float(bucket.capacity)), repr(float(bucket.rate)), repr(float(bucket.amount))])
        raw = self._script(keys=keys, args=args)
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        wait, _, index = text.partition(":")
        return (math.inf if wait == "inf" else float(wait)), int(index) - 1

    def take(self, buckets: list[Bucket]) -> tuple[float, int]:
        return self._run(buckets, force=False)

    def charge(self, buckets: list[Bucket]) -> None:
        self._run(buckets, force=True)


def buckets_for(scope: str, name: str, limit: RateLimit | None, tokens: int, label: str) -> list[Bucket]:
    """The request and token buckets of one scope (``provider`` / ``tenant``) for one call."""
    if limit is None:
        return []
    found: list[Bucket] = []
    if limit.requests_per_minute:
        rpm = float(limit.requests_per_minute)
        capacity = max(1.0, rpm / 60.0 * limit.burst_seconds)
        label_rpm = f"{label} requests per minute ({rpm:g})"
        found.append(Bucket(f"{scope}:{name}:requests", capacity, rpm / 60.0, 1.0, label_rpm))
    if limit.tokens_per_minute and tokens:
        tpm = float(limit.tokens_per_minute)
        capacity = max(1.0, tpm / 60.0 * limit.burst_seconds)
        label_tpm = f"{label} tokens per minute ({tpm:g})"
        found.append(Bucket(f"{scope}:{name}:tokens", capacity, tpm / 60.0, float(tokens), label_tpm))
    return found


class RateLimiter:
    """Waits (up to ``max_wait`` seconds) for all of a call's buckets, then fails with the reason."""

    def __init__(
        self,
        store: BucketStore | None = None,
        *,
        max_wait: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store: BucketStore = store or LocalBucketStore()
        self.max_wait = max_wait
        self._sleep = sleep
        self._clock = clock

    def acquire(self, buckets: list[Bucket], *, what: str) -> float:
        """Take the buckets; returns the seconds spent waiting. Raises :class:`RateLimitExceededError`."""
        if not buckets:
            return 0.0
        started = self._clock()
        deadline = started + self.max_wait
        while True:
            wait, short = self.store.take(buckets)
            if wait <= 0:
                return self._clock() - started
            blocking = buckets[short]
            if math.isinf(wait):
                raise RateLimitExceededError(
                    f"{what} needs {blocking.amount:g} of {blocking.label}, more than the bucket can ever hold; "
                    "raise the limit or shorten the request",
                    scope=blocking.key,
                    wait_seconds=None,
                )
            now = self._clock()
            if now + wait > deadline:
                raise RateLimitExceededError(
                    f"{what} was refused by the rate limit on {blocking.label}: it would need to wait "
                    f"{wait:.1f} s more, and calls wait at most {self.max_wait:g} s",
                    scope=blocking.key,
                    wait_seconds=wait,
                )
            self._sleep(min(wait, max(0.0, deadline - now)))

    def settle(self, buckets: list[Bucket]) -> None:
        """Charge (or refund, with negative amounts) the difference between estimate and actual usage."""
        nonzero = [b for b in buckets if b.amount]
        if nonzero:
            self.store.charge(nonzero)
