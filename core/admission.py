"""At most ``MAX_CONCURRENT_REQUESTS`` HTTP requests in progress per server process; the next is a 503 at once.

Django runs each request of the ASGI server in a thread of its own, and uvicorn accepts whatever arrives: past
capacity, hundreds of threads take turns on one core, each holding (or waiting for) one of the pool's connections,
and every request slows down until all of them time out (issue #14: p50 of 11 s). Here, at the edge, a request beyond
the limit is refused before Django sees it — no thread, no query, no middleware — with ``Retry-After`` and the API's
error body (``core/outages.py``: ``dependency`` is ``server``). ``/healthz`` and ``/metrics`` are never refused (a
probe must see the process as alive under load), nor websockets (they hold no thread while idle); an event stream
(SSE) stops counting once its headers are sent, for the same reason.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from core import outages
from core.body_limit import App, Receive, Scope, Send

log = logging.getLogger(__name__)

EXEMPT = ("/healthz", "/metrics")


class AdmissionLimit:
    def __init__(self, app: App, *, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_progress = 0  # one event loop per process: no lock needed
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.limit or scope.get("path", "").startswith(EXEMPT):
            await self.app(scope, receive, send)
            return
        if self.in_progress >= self.limit:
            self.refused += 1
            if self.refused % 100 == 1:  # under overload: one line per hundred refusals, not one each
                log.warning("at capacity: %d requests in progress; refused %d so far", self.in_progress, self.refused)
            await _refuse(send)
            return
        self.in_progress += 1
        counted = True

        async def send_and_release_streams(message: dict[str, Any]) -> None:
            # An event stream (SSE) lives as long as its run but holds no thread while it waits, like a websocket:
            # once its headers are out it no longer counts against the limit.
            nonlocal counted
            if counted and message["type"] == "http.response.start" and _is_event_stream(message):
                counted = False
                self.in_progress -= 1
            await send(message)

        try:
            await self.app(scope, receive, send_and_release_streams)
        finally:
            if counted:
                self.in_progress -= 1


def _is_event_stream(message: dict[str, Any]) -> bool:
    return any(name.lower() == b"content-type" and value.startswith(b"text/event-stream") for name, value in message.get("headers", []))


async def _refuse(send: Send) -> None:
    body = json.dumps(outages.body(outages.SERVER_BUSY)).encode()
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode(), value.encode()) for name, value in outages.headers(outages.SERVER_BUSY).items()]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
