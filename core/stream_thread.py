"""An open event stream holds no thread of its own: its Django work runs on the process's one stream thread.

Django's ``ASGIHandler`` gives each request a ``ThreadSensitiveContext``: its synchronous work (``request_started``,
middleware, view, ``response.close()``) runs on one thread made for the request, kept until the response is closed.
For a run's event stream (``GET /api/v1/runs/<id>/stream``, an async iterator sent from the event loop) that is the
run's whole life, idle: thirty open streams were thirty more threads (issue #49). Here, outside Django's handler, such
a request enters asgiref's ``ThreadSensitiveContext(executor=...)`` with the process's single stream thread, so every
stream's synchronous work — the view (authentication, scoping, its slot among the caller's open streams), its short
database reads, its close — runs there one call at a time, as Channels runs the websockets' database work on one
thread. Each call is short; none holds a connection between calls (``database_sync_to_async`` and ``request_started``
/``request_finished`` give the pooled connection back), so an idle stream holds neither a thread nor a connection.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext

from core.body_limit import App, Receive, Scope, Send

STREAM_PATH = re.compile(r"^/api/v1/runs/[^/]+/stream/?$")


class StreamThread:
    def __init__(self, app: App) -> None:
        self.app = app
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streams")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "GET" and STREAM_PATH.match(scope.get("path", "")):
            async with ThreadSensitiveContext(executor=self.executor):  # Django's own context nests inside this one
                await self.app(scope, receive, send)
            return
        await self.app(scope, receive, send)
