"""Fixtures: a local HTTP server on 127.0.0.1 and a guard that refuses any other connection."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class LocalServer:
    host: str
    port: int
    requests: list[Recorded] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"


def _make_handler(server_state: LocalServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            return

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            server_state.requests.append(
                Recorded(self.command, self.path, {k: v for k, v in self.headers.items()}, body)
            )
            path = self.path.split("?", 1)[0]
            if path.startswith("/redirect-metadata"):
                self._send(302, b"", {"Location": "http://169.254.169.254/latest/meta-data/"})
            elif path.startswith("/redirect-local"):
                self._send(302, b"", {"Location": "/echo/after-redirect"})
            elif path.startswith("/redirect-loop"):
                self._send(302, b"", {"Location": "/redirect-loop"})
            elif path.startswith("/slow"):
                time.sleep(2.0)
                self._send(200, b'{"late": true}', {"Content-Type": "application/json"})
            elif path.startswith("/status/"):
                code = int(path.rsplit("/", 1)[-1])
                self._send(code, b"order not found: O202411280001 does not exist", {"Content-Type": "text/plain"})
            elif path.startswith("/text"):
                self._send(200, "hello 世界".encode(), {"Content-Type": "text/plain; charset=utf-8"})
            else:
                payload = {
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body.decode("utf-8", "replace"),
                }
                self._send(200, json.dumps(payload).encode(), {"Content-Type": "application/json"})

        def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    return Handler


@pytest.fixture(scope="module")
def local_server() -> Iterator[LocalServer]:
    state = LocalServer("127.0.0.1", 0)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(state))
    httpd.daemon_threads = True
    state.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(autouse=True)
def connect_guard(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Record every outgoing TCP connection; refuse (without any traffic) anything but 127.0.0.1."""
    attempts: list[tuple[str, int]] = []
    real = socket.create_connection

    def guarded(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        host, port = address[0], address[1]
        attempts.append((host, port))
        if host != "127.0.0.1":
            raise OSError(f"test guard: refusing to connect to {host}:{port}")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", guarded)
    return attempts
