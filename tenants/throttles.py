"""API rate limits per caller: per API key (or per user, for a browser session), never per address only.

Rates come from ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` (``API_THROTTLE_RATE``, ``RUN_CREATE_THROTTLE_RATE``),
read on every request rather than frozen on the class as DRF does, so a changed setting applies at once. Counters live
in Django's cache: Redis with ``REDIS_URL`` (shared by every server process), local memory in embedded mode. A refused
request is a 429 with ``Retry-After`` and a JSON ``detail``. While Redis is down, counters are kept in the process's
memory (a warning is logged), so a Redis outage neither lifts the limits nor turns the API into 503s.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.core.cache.backends.locmem import LocMemCache
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from config.outages import REDIS, dependency_down
from tenants.models import ApiKey

log = logging.getLogger(__name__)

#: Where counters go while Redis is down (config/outages.py), and how long before Redis is tried again.
_OUTAGE_COUNTERS = LocMemCache("agentops-throttle-outage", {})
OUTAGE_RETRY_SECONDS = 5.0
_redis_down_until = 0.0


def caller_ident(request: Any) -> str | None:
    """Whose budget a request spends: its API key (by visible prefix: unique, random, stable) or its user."""
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiKey):
        return f"key:{auth.prefix}"
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return None  # anonymous: refused by authentication anyway, nothing to count


class _CallerThrottle(SimpleRateThrottle):
    def __init__(self) -> None:  # DRF parses the rate here; it is read per request in allow_request instead
        pass

    def get_rate(self) -> str | None:
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def scope_for(self, view: Any) -> str | None:
        return self.scope

    def allow_request(self, request: Any, view: Any) -> bool:
        scope = self.scope_for(view)
        if scope is None:
            return True
        self.scope = scope
        self.rate = self.get_rate()
        if self.rate is None:  # "off"
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        global _redis_down_until
        if time.monotonic() >= _redis_down_until:
            try:
                return super().allow_request(request, view)
            except Exception as exc:
                if dependency_down(exc) != REDIS:
                    raise
                # Redis is down: count in this process meanwhile, so an outage neither turns every request into a 503
                # nor lifts the limit (each process allows the rate on its own); try Redis again in a few seconds.
                _redis_down_until = time.monotonic() + OUTAGE_RETRY_SECONDS
                log.warning("rate limits: Redis is unavailable (%s: %s); counting in this process for %ss",
                            type(exc).__name__, exc, OUTAGE_RETRY_SECONDS)
        self.cache = _OUTAGE_COUNTERS
        return super().allow_request(request, view)

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        ident = caller_ident(request)
        return None if ident is None else self.cache_format % {"scope": self.scope, "ident": ident}


class PerCallerThrottle(_CallerThrottle):
    """Every API request, per key or user: ``API_THROTTLE_RATE``."""

    scope = "api"


class ActionThrottle(_CallerThrottle):
    """An action's own budget, named by the view: ``throttle_scopes = {"create": "run_create"}``."""

    scope = None

    def scope_for(self, view: Any) -> str | None:
        return getattr(view, "throttle_scopes", {}).get(getattr(view, "action", None))
