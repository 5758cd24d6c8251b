"""The process's rate-limit bucket store, shared by the model gateway and the tool gateway's rate limits.

Redis (one budget across every worker process) when ``REDIS_URL`` is set, else process memory.
"""

from __future__ import annotations

import threading

from django.conf import settings

from llm.ratelimit import BucketStore, LocalBucketStore, RedisBucketStore

_lock = threading.Lock()
_store: BucketStore | None = None


def bucket_store() -> BucketStore:
    """One store per process: Redis (shared by every worker) when configured, else in memory."""
    global _store
    with _lock:
        if _store is None:
            redis_url = getattr(settings, "REDIS_URL", None)
            _store = RedisBucketStore.from_url(redis_url) if redis_url else LocalBucketStore()
        return _store
