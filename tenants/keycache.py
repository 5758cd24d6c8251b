"""A short-lived in-process cache of API keys, so an authenticated request costs no database query for its key.

Issue #14: the key lookup (a join with the tenant and the owner, and a subquery for the owner's role) was a fifth of
an API request's CPU. Here a process keeps what that lookup found, keyed by the key's hash, for at most
``API_KEY_CACHE_SECONDS``, and trusts it only while the deployment-wide *access stamp* is the one it was found under.

The stamp lives in Django's cache (Redis with ``REDIS_URL``, so every server process reads the same one) and changes,
at once and again when the transaction commits, whenever something that decides a key's access is saved or deleted:
an API key (revocation), a membership (role change, removal), a tenant (deactivation), a user (deactivation,
deletion). Signal receivers (connected in ``tenants.apps``) do it, so no path escapes — the services, the admin
(including Django's own user admin), cascades, the shell. A revoked key is therefore refused on the next request, in
every process. A user's login (``last_login``) and a key's ``last_used_at`` change nothing.

Embedded mode's cache is process memory, which other processes (a management command) cannot reach, so the cache is
off there by default (``API_KEY_CACHE_SECONDS=0``). While Redis is unreachable the cache is bypassed (every request
reads the database, as without it) and emptied; a change made during the outage whose stamp could not be written is
still seen by every process within ``API_KEY_CACHE_SECONDS``.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import models, transaction

from core.outages import REDIS, dependency_down
from tenants.models import ApiKey, Tenant

log = logging.getLogger(__name__)

STAMP_KEY = "tenants:api-key-access-stamp"
#: At most this many keys are kept per process (a flood of distinct valid keys cannot grow it further).
MAX_ENTRIES = 10_000
#: After Redis failed, the cache is bypassed for this long before Redis is tried again.
OUTAGE_RETRY_SECONDS = 5.0
#: ``last_used_at`` is written at most this often per key and process.
TOUCH_EVERY_SECONDS = 60.0


@dataclass
class Entry:
    stamp: str
    expires: float
    key: tuple[Any, ...]
    tenant: tuple[Any, ...]
    owner: tuple[Any, ...]
    owner_role: str | None
    touched: float


_entries: dict[str, Entry] = {}
_lock = threading.Lock()
_redis_down_until = 0.0


def enabled() -> bool:
    return settings.API_KEY_CACHE_SECONDS > 0


def current_stamp() -> str | None:
    """The deployment's access stamp; ``None`` when it cannot be read (then nothing cached may be trusted)."""
    global _redis_down_until
    if time.monotonic() < _redis_down_until:
        return None
    try:
        stamp = cache.get(STAMP_KEY)
        if stamp is None:  # never set, or Redis lost it: start a new one (entries found under an old one are void)
            cache.add(STAMP_KEY, uuid.uuid4().hex, timeout=None)
            stamp = cache.get(STAMP_KEY)
    except Exception as exc:
        if dependency_down(exc) != REDIS:
            raise
        _redis_down_until = time.monotonic() + OUTAGE_RETRY_SECONDS
        _entries.clear()
        log.warning("API key cache: Redis is unavailable (%s); reading keys from the database for %ss",
                    type(exc).__name__, OUTAGE_RETRY_SECONDS)
        return None
    return stamp


def invalidate() -> None:
    """Void every process's cached keys: now (this transaction's own reads see its changes) and after commit (no
    process may cache what it read before the commit under the new stamp)."""
    _entries.clear()
    _new_stamp()
    transaction.on_commit(_new_stamp)


def _new_stamp() -> None:
    try:
        cache.set(STAMP_KEY, uuid.uuid4().hex, timeout=None)
    except Exception as exc:
        if dependency_down(exc) != REDIS:
            raise
        log.warning("API key cache: could not renew the access stamp (Redis unavailable: %s); other processes see the "
                    "change within API_KEY_CACHE_SECONDS", type(exc).__name__)


def _values(instance: models.Model) -> tuple[Any, ...]:
    return tuple(getattr(instance, f.attname) for f in instance._meta.concrete_fields)


def _rebuild(model: type[models.Model], values: tuple[Any, ...]) -> Any:
    names = [f.attname for f in model._meta.concrete_fields]
    # A fresh instance per request, sharing nothing mutable (a tenant's settings) with the cache or other requests.
    return model.from_db("default", names, [copy.deepcopy(v) if isinstance(v, dict | list) else v for v in values])


def get(key_hash: str, stamp: str) -> Any | None:
    """The cached key for ``key_hash`` (a fresh ApiKey with its tenant, owner and ``owner_role``), or None."""
    entry = _entries.get(key_hash)
    if entry is None or entry.stamp != stamp or entry.expires <= time.monotonic():
        return None
    key = _rebuild(ApiKey, entry.key)
    key.tenant = _rebuild(Tenant, entry.tenant)  # the relations set through their descriptors: no query on access
    key.created_by = _rebuild(get_user_model(), entry.owner)
    key.owner_role = entry.owner_role
    now = time.monotonic()
    if now - entry.touched >= TOUCH_EVERY_SECONDS:
        entry.touched = now
        key.touch()
    return key


def put(key_hash: str, stamp: str, key: Any) -> None:
    with _lock:
        if len(_entries) >= MAX_ENTRIES:
            _entries.clear()
        now = time.monotonic()
        _entries[key_hash] = Entry(stamp=stamp, expires=now + settings.API_KEY_CACHE_SECONDS, key=_values(key),
                                   tenant=_values(key.tenant), owner=_values(key.created_by),
                                   owner_role=getattr(key, "owner_role", None), touched=now)


# --- what voids the stamp (connected in tenants.apps.TenantsConfig.ready) -------------------------------------------

#: Saves of these fields alone change no one's access.
_HARMLESS_FIELDS = {"last_login", "last_used_at"}


def on_change(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    update_fields = kwargs.get("update_fields")
    if update_fields is not None and set(update_fields) <= _HARMLESS_FIELDS:
        return
    if kwargs.get("created") and sender is ApiKey:
        return  # a new key was in nobody's cache
    invalidate()
