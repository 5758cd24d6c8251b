"""``/healthz``: database, broker and channel layer, each with its own verdict."""

from __future__ import annotations

import time
import uuid
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse


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
    if settings.EMBEDDED:
        return "in-process (embedded mode)"
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    finally:
        client.close()
    return "redis"


def _channel_layer() -> str:
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer configured")

    async def roundtrip() -> None:
        channel = await layer.new_channel("healthz.")
        token = uuid.uuid4().hex
        await layer.send(channel, {"type": "health.ping", "token": token})
        message = await layer.receive(channel)
        if message.get("token") != token:
            raise RuntimeError("the channel layer returned a different message")

    if settings.EMBEDDED:
        # The embedded layer lives in this process; a send/receive on a private channel proves it works.
        async_to_sync(roundtrip)()
        return "in-memory (embedded mode)"
    async_to_sync(roundtrip)()
    return "redis"


def healthz(request: HttpRequest) -> JsonResponse:
    checks = {"database": _timed(_database), "broker": _timed(_broker), "channel_layer": _timed(_channel_layer)}
    healthy = all(c["ok"] for c in checks.values())
    body = {"status": "ok" if healthy else "unavailable", "mode": "embedded" if settings.EMBEDDED else "production", "checks": checks}
    return JsonResponse(body, status=200 if healthy else 503)
