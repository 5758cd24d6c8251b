"""One run at a time of a periodic job, across processes: a short lock per job.

Celery beat must run once per deployment; when two beats run by mistake, every periodic task is
sent twice. The jobs are idempotent per row (each row is claimed by a conditional ``UPDATE``), so
a duplicate changes nothing twice; this lock only saves the duplicate work. It lives in Django's
cache: Redis in production (``SET key token NX EX ttl``, shared by every worker), local memory in
embedded mode (one process, so an in-process lock is enough). Its time to live is the job's beat
interval, so a worker that dies holding it delays the job by one interval at most. If the cache
cannot be reached the job runs anyway: correctness never depends on the lock.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)

#: Time to live of a job's lock when the job has no fixed interval in ``CELERY_BEAT_SCHEDULE``.
DEFAULT_TTL_SECONDS = 30.0


def beat_interval(task: str) -> float:
    """The interval ``CELERY_BEAT_SCHEDULE`` runs ``task`` at, in seconds."""
    for entry in getattr(settings, "CELERY_BEAT_SCHEDULE", {}).values():
        schedule = entry.get("schedule")
        if entry.get("task") == task and isinstance(schedule, int | float):
            return float(schedule)
    return DEFAULT_TTL_SECONDS


def lock_key(task: str) -> str:
    # Separate deployments sharing one Redis use separate queues (as the worker heartbeat does).
    return f"job-lock:{settings.CELERY_TASK_DEFAULT_QUEUE}:{task}"


@contextmanager
def job_lock(task: str, ttl_seconds: float | None = None) -> Iterator[bool]:
    """Yields True if this process may run ``task`` now, False if another run of it holds the lock."""
    key, token = lock_key(task), uuid.uuid4().hex
    ttl = max(1, math.ceil(ttl_seconds if ttl_seconds is not None else beat_interval(task)))
    held: bool | None
    try:
        held = bool(cache.add(key, token, timeout=ttl))
    except Exception as exc:  # the cache (Redis) is down: the rows' own guards keep the job correct
        log.warning("periodic job %s runs without its lock: the cache could not be reached (%s)", task, type(exc).__name__)
        held = None
    if held is False:
        log.info("periodic job %s skipped: another run of it holds the lock (is a second beat running?)", task)
        yield False
        return
    try:
        yield True
    finally:
        if held:
            _release(task, key, token)


def _release(task: str, key: str, token: str) -> None:
    try:  # only our own lock: one that expired and was taken since belongs to another run
        if cache.get(key) == token:
            cache.delete(key)
    except Exception as exc:  # it expires by itself
        log.warning("periodic job %s could not release its lock (%s)", task, type(exc).__name__)
