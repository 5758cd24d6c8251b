"""Slow servers a tenant could name, on 127.0.0.1, that keep every caller waiting until the test opens the gate.

``GatedMcpServer``: the mcp package's own streamable-HTTP server (tools ``add`` and ``echo``), holding each session's
first request (``initialize``) until ``gate`` is set; ``GatedHttp``: a plain HTTP server answering every request with
``body`` once the gate is set (an OpenAI-compatible provider's ``/models``, for its "test connection"). Both count
the callers waiting (``arrived``), so a test acts while they wait: that is when a request must hold no database
connection (core/remote_waits.py).

``Request`` makes one request on its own thread, as a server process would, and keeps that thread's database
connection object, so a test can look at it while the request waits (``holds_connection``).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.db import connections

#: The longest a gated caller is held when the test never opens the gate (a failing test still ends).
HOLD_AT_MOST = 30.0


class Gate:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self._lock = threading.Lock()
        self.arrived = 0

    def arrive(self) -> None:
        with self._lock:
            self.arrived += 1

    def wait_for(self, count: int, timeout: float) -> int:
        """Until ``count`` callers are waiting (or ``timeout``); returns how many are."""
        deadline = time.monotonic() + timeout
        while self.arrived < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.arrived

    def open(self) -> None:
        self.gate.set()


class GatedMcpServer(Gate):
    def __init__(self) -> None:
        super().__init__()
        import uvicorn
        from mcp.server.mcpserver import MCPServer

        server = MCPServer("slow")

        @server.tool(description="Add two integers.")
        def add(a: int, b: int) -> int:
            return a + b

        @server.tool(description="Say it back.")
        def echo(text: str) -> str:
            return text

        inner = server.streamable_http_app()

        async def gated(scope: dict[str, Any], receive: Any, send: Any) -> None:
            headers = dict(scope.get("headers") or [])
            if scope["type"] == "http" and scope["method"] == "POST" and b"mcp-session-id" not in headers:
                self.arrive()
                deadline = time.monotonic() + HOLD_AT_MOST
                while not self.gate.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
            await inner(scope, receive, send)

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        config = uvicorn.Config(gated, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self._web = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._web.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def __enter__(self) -> GatedMcpServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._web.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.open()
        self._web.should_exit = True
        self._thread.join(timeout=5)


class GatedHttp(Gate):
    def __init__(self, body: bytes) -> None:
        super().__init__()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                gate.arrive()
                gate.gate.wait(HOLD_AT_MOST)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> GatedHttp:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.open()
        self._server.shutdown()
        self._server.server_close()


class Request:
    """``call()`` on a thread of its own; ``response`` once it is done; its thread's connection kept to look at."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.response: Any = None
        self.error: BaseException | None = None
        self.wrapper: Any = None
        self._ready = threading.Event()
        self._call = call
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        self.wrapper = connections["default"]
        self._ready.set()
        try:
            self.response = self._call()
        except BaseException as exc:  # re-raised by result()
            self.error = exc
        finally:
            connections.close_all()  # the test client leaves it open; a server gives it back at request_finished

    def holds_connection(self) -> bool:
        return self.wrapper is not None and self.wrapper.connection is not None

    def result(self, timeout: float = 30.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"still running after {timeout} s"
        if self.error is not None:
            raise self.error
        return self.response
