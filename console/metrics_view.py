"""``/metrics``: the process (or, in production, all processes') counters, plus gauges read from the database."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

from agents.attention import AttentionCollector
from agents.metrics import ApprovalQueueCollector, RunQueueCollector

_database_gauges = CollectorRegistry()  # no auto-describe: collecting queries the database, so only at scrape time
_database_gauges.register(ApprovalQueueCollector())
_database_gauges.register(AttentionCollector())
_database_gauges.register(RunQueueCollector())


def _authorized(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    if not token:
        return True  # not configured: open (check --deploy warns, agentops.W001)
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def metrics(request: HttpRequest) -> HttpResponse:
    if not _authorized(request):
        response = HttpResponse("metrics need Authorization: Bearer <METRICS_TOKEN>\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if settings.PROMETHEUS_MULTIPROC_DIR:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    body = generate_latest(registry) + generate_latest(_database_gauges)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
