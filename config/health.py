"""``/healthz``: database, broker, channel layer and workers, each with its own verdict; ``down`` names the failing ones."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import channel_layers, get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from config.celery import app
from config.workers import WORKER_BEAT_SECONDS, seen_workers
from core import outages


def _timed(check: Any) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        detail = check()
        ok = True
    except Exception as exc:
        detail, ok = f"{type(exc).__name__}: {exc}", False
    return {"ok": ok, "detail": detail, "ms": round((time.perf_counter() - started) * 1000, 1)}


def _database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return connection.vendor


def _broker() -> str:
    """Connect the way the workers do: Celery's own transport (an import error or a refused connection shows here)."""
    if settings.EMBEDDED:
        return "in-process (embedded mode)"
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=2)
        conn.default_channel.client.ping()
    return "redis"


def _workers() -> str:
    """The workers consuming this deployment's queue, against how many the deployment expects (``WORKERS_EXPECTED``):
    one worker that exited while another lives is reported, not hidden behind the survivor."""
    if settings.EMBEDDED:
        return "in-process (embedded mode)"
    seen, expected, queue = seen_workers(), settings.WORKERS_EXPECTED, settings.CELERY_TASK_DEFAULT_QUEUE
    window = WORKER_BEAT_SECONDS * 3
    if not seen:
        raise RuntimeError(f"no worker seen on queue {queue!r} in the last {window} s: runs are accepted but wait in the queue")
    if len(seen) < expected:
        raise RuntimeError(f"{len(seen)} of {expected} expected workers seen on queue {queue!r} in the last {window} s "
                           f"({', '.join(seen)}): restart the missing ones (deploy/systemd)")
    return f"{len(seen)} of {expected} expected seen on queue {queue!r} in the last {window} s: {', '.join(seen)}"


def _channel_layer() -> str:
    """A message sent and received on a private channel, within 3 s.

    In production the check uses a layer instance of its own: this runs in a worker thread's event loop, and
    the server's shared layer is already receiving in the main loop (channels_redis allows one loop per layer).
    """
    if settings.EMBEDDED:
        layer = get_channel_layer()  # it lives in this process: the shared instance is the one to prove
        if layer is None:
            raise RuntimeError("no channel layer configured")
    else:
        layer = channel_layers.make_backend("default")

    async def roundtrip() -> None:
        try:
            channel = await layer.new_channel("healthz.")
            token = uuid.uuid4().hex
            await layer.send(channel, {"type": "health.ping", "token": token})
            message = await asyncio.wait_for(layer.receive(channel), timeout=3)
            if message.get("token") != token:
                raise RuntimeError("the channel layer returned a different message")
        finally:
            if not settings.EMBEDDED:
                await layer.close_pools()

    async_to_sync(roundtrip)()
    return "in-memory (embedded mode)" if settings.EMBEDDED else "redis"


def healthz(request: HttpRequest) -> JsonResponse:
    """503 (with ``Retry-After``) when a dependency the server needs is down, named in ``down``; 200 ``degraded`` when
    only the workers are missing."""
    checks = {"database": _timed(_database), "broker": _timed(_broker), "channel_layer": _timed(_channel_layer),
              "workers": _timed(_workers)}
    down = [name for name, check in checks.items() if not check["ok"]]
    serving = not [name for name in down if name != "workers"]
    status = "unavailable" if not serving else "ok" if not down else "degraded"
    body = {"status": status, "mode": "embedded" if settings.EMBEDDED else "production", "down": down, "checks": checks}
    return JsonResponse(body, status=200 if serving else 503, headers=None if serving else outages.headers())
