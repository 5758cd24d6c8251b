"""A stand-in for an attacker's host: a tiny HTTP server on 127.0.0.1 that records what it is sent."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class RecordingSink:
    """Answers every request with ``status`` and ``body``; ``requests`` holds (method, path, headers, body)."""

    def __init__(self, *, status: int = 200, body: str = '{"object": "list", "data": []}') -> None:
        self.status = status
        self.body = body
        self.requests: list[tuple[str, str, dict[str, str], str]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
                sink.requests.append((self.command, self.path, dict(self.headers.items()), body))
                data = sink.body.encode()
                self.send_response(sink.status)
                self.send_header("content-type", "application/json" if data[:1] in (b"{", b"[") else "text/plain")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def seen(self) -> str:
        """Everything received, as one string (to assert a secret never arrived)."""
        return repr(self.requests)

    def __enter__(self) -> RecordingSink:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
