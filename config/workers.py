"""Which Celery workers are alive: each worker writes a short-lived key to Redis; ``/healthz`` reads them.

A worker sets ``agentops:worker:<queue>:<hostname>`` every ``WORKER_BEAT_SECONDS`` with a TTL of three beats, so a
worker that died (or lost Redis) disappears within that time. Embedded mode has its worker inside the server.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

WORKER_BEAT_SECONDS = 10
_stop = threading.Event()


def _client() -> Any:
    import redis  # here, not at import: this module loads with the Celery app, and redis-py pulls in the OpenTelemetry SDK

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def _prefix() -> str:
    return f"agentops:worker:{settings.CELERY_TASK_DEFAULT_QUEUE}:"


def start_beating(hostname: str) -> None:
    """Called once when a worker is ready (``worker_ready``): a daemon thread keeps its key fresh."""
    if settings.EMBEDDED:
        return
    key = _prefix() + hostname

    def beat() -> None:
        client = _client()
        while not _stop.is_set():
            try:
                client.set(key, "1", ex=WORKER_BEAT_SECONDS * 3)
            except Exception as exc:  # Redis down: the key expires, /healthz reports no worker; keep trying
                log.warning("worker heartbeat to Redis failed: %s", type(exc).__name__)
            _stop.wait(WORKER_BEAT_SECONDS)
        with contextlib.suppress(Exception):  # best effort on the way out; the TTL removes the key anyway
            client.delete(key)

    threading.Thread(target=beat, name="agentops-worker-heartbeat", daemon=True).start()


def stop_beating() -> None:
    _stop.set()


def seen_workers() -> list[str]:
    """Hostnames of the workers on this deployment's queue that beat within the last three intervals."""
    client = _client()
    try:
        prefix = _prefix()
        return sorted(k.decode()[len(prefix):] for k in client.scan_iter(match=prefix + "*", count=100))
    finally:
        client.close()
