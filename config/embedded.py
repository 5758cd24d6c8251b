"""Embedded mode: a real Celery worker inside the server process, on the in-memory broker.

The task, the worker and the channel layer are the same code path as production; only the
transport is in-process. Production runs ``celery -A config worker`` separately instead.

Celery beat runs embedded too (``celery.beat.EmbeddedService`` in a thread, an in-memory
schedule): the whole ``CELERY_BEAT_SCHEDULE`` — the run sweeper, approval expiry, release
guards — is sent through the in-memory broker to the embedded worker, as beat would in
production. The in-memory broker forgets its queue when the server stops, so after a restart
the sweeper re-enqueues the runs that were queued or running. Production runs
``celery -A config beat`` next to the workers.
"""

from __future__ import annotations

import logging
import threading

from celery.beat import EmbeddedService
from celery.contrib.testing.worker import TestWorkController, setup_app_for_worker

from config.celery import app

log = logging.getLogger(__name__)

_started = threading.Event()
_lock = threading.Lock()


def start_embedded_worker(concurrency: int = 4) -> None:
    """Start the in-process worker once; returns when it consumes from the queue."""
    with _lock:
        if _started.is_set():
            return
        setup_app_for_worker(app, loglevel="WARNING", logfile=None)
        worker = TestWorkController(
            app=app, concurrency=concurrency, pool="threads", loglevel="WARNING", logfile=None,
            hostname="embedded@agentops", ready_callback=None,
            without_heartbeat=True, without_mingle=True, without_gossip=True,
            queues=[app.conf.task_default_queue],
        )
        thread = threading.Thread(target=worker.start, name="embedded-celery-worker", daemon=True)
        thread.start()
        worker.ensure_started()
        _started.set()
        log.info("embedded Celery worker started (%d threads, in-memory broker)", concurrency)
        beat = EmbeddedService(app, thread=True, scheduler_cls="celery.beat:Scheduler")
        beat.start()
