"""``/metrics``: the process (or, in production, all processes') counters, plus gauges read from the database."""

from __future__ import annotations

import os

from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

from agents.metrics import ApprovalQueueCollector

_database_gauges = CollectorRegistry()  # no auto-describe: collecting queries the database, so only at scrape time
_database_gauges.register(ApprovalQueueCollector())


def metrics(request: HttpRequest) -> HttpResponse:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    body = generate_latest(registry) + generate_latest(_database_gauges)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
