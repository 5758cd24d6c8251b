"""The Celery app. Tasks carry only ids; every run is a database row."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_ready, worker_shutdown

from config import broker_patch, workers
from config.heap import freeze_startup_heap

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("agentops")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _worker_init(**kwargs: Any) -> None:
    from django.conf import settings

    from config.dbroles import use_worker_timeouts

    use_worker_timeouts()
    if not settings.EMBEDDED:  # a worker on Redis survives a Redis blip with unacknowledged messages; loaded only here,
        broker_patch.apply()  # since kombu's Redis transport imports redis-py, which loads the OpenTelemetry SDK


@worker_ready.connect
def _worker_ready(sender: Any = None, **kwargs: Any) -> None:
    workers.start_beating(sender.hostname if sender is not None else "worker")
    freeze_startup_heap()  # the worker has imported its tasks: keep them out of the collector's way (config/heap.py)


@worker_shutdown.connect
def _worker_shutdown(**kwargs: Any) -> None:
    workers.stop_beating()
