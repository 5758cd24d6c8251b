"""The peer of ``bench/api_load.py``: the same three reads, each one indexed query, in a bare ASGI app (no Django).

    uvicorn --app-dir bench peer_asgi:app --workers N     # PEER_DATABASE_URL, PEER_TENANT_ID in the environment

It answers what the console's API answers for the reads the benchmark makes, from the same rows, with nothing else:
no authentication, no throttling, no middleware, no serializer, a psycopg async pool (10 connections per process).
So the ratio of the console's latency to this one's is what the framework and our code add to a query.
"""

from __future__ import annotations

import datetime
import decimal
import json
import os
import re
import uuid
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

DATABASE_URL = os.environ["PEER_DATABASE_URL"]
TENANT_ID = int(os.environ["PEER_TENANT_ID"])
RUN_COLUMNS = ("id, status, terminal_reason, input, output, error, usage, step, last_seq, cancel_requested, created_at, "
               "started_at, finished_at, needs_attention, attention_reasons, attention_resolved_at, attention_resolution, "
               "session_id")
DETAIL = re.compile(r"^/api/v1/runs/([0-9a-f-]{36})$")
EVENTS = re.compile(r"^/api/v1/runs/([0-9a-f-]{36})/events$")

_pool: AsyncConnectionPool | None = None


def _default(value: Any) -> Any:
    if isinstance(value, datetime.datetime | uuid.UUID | decimal.Decimal):
        return str(value)
    raise TypeError(type(value).__name__)


async def _pool_() -> AsyncConnectionPool:
    global _pool
    if _pool is None:
        _pool = AsyncConnectionPool(DATABASE_URL, min_size=2, max_size=10, open=False, kwargs={"row_factory": dict_row})
        await _pool.open()
    return _pool


async def _query(sql: str, params: list[Any]) -> list[dict[str, Any]]:
    pool = await _pool_()
    async with pool.connection() as conn:
        cursor = await conn.execute(sql, params)
        return await cursor.fetchall()


async def _answer(path: str, query: str) -> tuple[int, Any]:
    if path == "/api/v1/runs":
        limit = min(int(dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("limit", 50)), 200)
        rows = await _query(f"SELECT {RUN_COLUMNS} FROM agents_run WHERE tenant_id = %s ORDER BY created_at DESC LIMIT %s",
                            [TENANT_ID, limit])
        return 200, {"results": rows}
    if match := EVENTS.match(path):
        rows = await _query("SELECT seq, step, type, span_id, parent_span_id, payload, at FROM agents_runevent "
                            "WHERE run_id = %s AND seq > 0 ORDER BY seq LIMIT 100", [match[1]])
        return 200, {"run": match[1], "events": rows}
    if match := DETAIL.match(path):
        rows = await _query(f"SELECT {RUN_COLUMNS} FROM agents_run WHERE id = %s AND tenant_id = %s", [match[1], TENANT_ID])
        return (200, rows[0]) if rows else (404, {"detail": "not found"})
    return 404, {"detail": "not found"}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    status, body = await _answer(scope["path"], scope.get("query_string", b"").decode())
    payload = json.dumps(body, default=_default).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
