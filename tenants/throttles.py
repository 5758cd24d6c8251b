"""API rate limits per caller: per API key (or per user, for a browser session), never per address only.

Rates come from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (``API_THROTTLE_RATE``, ``RUN_CREATE_THROTTLE_RATE``),
read on every request rather than frozen on the class as DRF does, so a changed setting applies at once. A request
spends one unit of the caller's API-wide budget and, when its view names one for the action
(``throttle_scopes = {"create": "run_create"}``), one of that action's budget.

Each budget is a token bucket of the process's bucket store (``core/buckets.py``, the one the model and tool
gateways' rate limits use): a rate of ``N/min`` holds ``N`` requests and refills ``N`` a minute. Both buckets are
taken at once, all or nothing — a refused request spends nothing — in **one Redis round trip** (an atomic script on
Redis's clock, so every server process shares one budget and concurrent requests never lose each other's count);
in embedded mode they live in process memory. Issue #14: DRF's ``SimpleRateThrottle``, used before, kept every
request's timestamp of the window in one pickled list per caller, read and written whole by each request (two round
trips per budget; at 220 requests/s a list of 13,000 timestamps), and that read-modify-write across processes lost
concurrent requests' counts.

A refused request is a 429 with ``Retry-After`` (when the short bucket holds the next unit) and a JSON ``detail``.
While Redis is down, the buckets are kept in the process's memory (a warning is logged) and Redis is tried again after
a few seconds, so a Redis outage neither lifts the limits nor turns the API into 503s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from core.buckets import bucket_store
from core.outages import REDIS, dependency_down
from llm.ratelimit import Bucket, LocalBucketStore
from tenants.models import ApiKey

log = logging.getLogger(__name__)

#: Where budgets go while Redis is down (core/outages.py), and how long before Redis is tried again.
_OUTAGE_STORE = LocalBucketStore()
OUTAGE_RETRY_SECONDS = 5.0
_redis_down_until = 0.0

_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def caller_ident(request: Any) -> str | None:
    """Whose budget a request spends: its API key (by visible prefix: unique, random, stable) or its user."""
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiKey):
        return f"key:{auth.prefix}"
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return None  # anonymous: refused by authentication anyway, nothing to count


def budget(scope: str, ident: str) -> Bucket | None:
    """The bucket of ``scope``'s rate for ``ident``, or None when the rate is ``off`` (or the scope has none)."""
    rate = api_settings.DEFAULT_THROTTLE_RATES.get(scope)
    if rate is None:
        return None
    count, _, period = rate.partition("/")
    requests, seconds = int(count), _SECONDS[period[0]]
    return Bucket(f"throttle:{scope}:{ident}", capacity=float(requests), rate=requests / seconds, amount=1.0,
                  label=f"{scope} ({rate})")


class CallerThrottle(BaseThrottle):
    """The caller's API-wide budget and its action's, taken together (see the module's docstring)."""

    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Any, view: Any) -> bool:
        ident = caller_ident(request)
        if ident is None:
            return True
        action_scope = getattr(view, "throttle_scopes", {}).get(getattr(view, "action", None))
        buckets = [b for b in (budget("api", ident), action_scope and budget(action_scope, ident)) if b]
        if not buckets:
            return True
        wait, _short = _take(buckets)
        if wait <= 0:
            return True
        self._wait = None if wait == float("inf") else wait
        return False

    def wait(self) -> float | None:
        return self._wait


def _take(buckets: list[Bucket]) -> tuple[float, int]:
    global _redis_down_until
    if time.monotonic() >= _redis_down_until:
        try:
            return bucket_store().take(buckets)
        except Exception as exc:
            if dependency_down(exc) != REDIS:
                raise
            # Redis is down: count in this process meanwhile, so an outage neither turns every request into a 503
            # nor lifts the limit (each process allows the rate on its own); try Redis again in a few seconds.
            _redis_down_until = time.monotonic() + OUTAGE_RETRY_SECONDS
            log.warning("rate limits: Redis is unavailable (%s: %s); counting in this process for %ss",
                        type(exc).__name__, exc, OUTAGE_RETRY_SECONDS)
    return _OUTAGE_STORE.take(buckets)
