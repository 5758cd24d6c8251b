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
from typing import Any

from celery.beat import EmbeddedService
from celery.worker import WorkController

from config.celery import app

log = logging.getLogger(__name__)

_started = threading.Event()
_lock = threading.Lock()
READY_TIMEOUT_SECONDS = 30


class EmbeddedWorker(WorkController):
    """Celery's own worker (``celery.worker.WorkController``, what ``celery worker`` runs), told when it consumes.

    Logging stays Django's (``settings.LOGGING``): the worker does not set up its own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.consuming = threading.Event()
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer: Any) -> None:
        super().on_consumer_ready(consumer)
        self.consuming.set()


def start_embedded_worker(concurrency: int = 4) -> None:
    """Start the in-process worker once; returns when it consumes from the queue."""
    with _lock:
        if _started.is_set():
            return
        app.finalize()
        app.set_current()
        app.set_default()
        worker = EmbeddedWorker(
            app=app, concurrency=concurrency, pool="threads", loglevel="WARNING", logfile=None,
            hostname="embedded@agentops", ready_callback=None,
            without_heartbeat=True, without_mingle=True, without_gossip=True,
            queues=[app.conf.task_default_queue],
        )
        thread = threading.Thread(target=worker.start, name="embedded-celery-worker", daemon=True)
        thread.start()
        if not worker.consuming.wait(READY_TIMEOUT_SECONDS):
            raise RuntimeError(f"the embedded Celery worker did not start consuming within {READY_TIMEOUT_SECONDS} s")
        _started.set()
        log.info("embedded Celery worker started (%d threads, in-memory broker)", concurrency)
        beat = EmbeddedService(app, thread=True, scheduler_cls="celery.beat:Scheduler")
        beat.start()
