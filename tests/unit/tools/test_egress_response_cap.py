"""The egress client's response bound (egress/guard.py, ``max_response_bytes``): a body past it ends in
``ResponseTooLarge`` while it is read, counted after decompression, so neither an endless answer nor a small gzip
bomb fills the process's memory. Real HTTP over a socket to a server on 127.0.0.1."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from egress.guard import ResponseTooLarge, guarded_client

LIMIT = 1024 * 1024


def _bomb(mebibytes: int) -> bytes:
    """``mebibytes`` MiB of zeros gzipped, a MiB at a time (about 1/1000 of it on the wire)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * (1024 * 1024)
    return b"".join([*(packer.compress(zeros) for _ in range(mebibytes)), packer.flush()])


#: 256 MiB decompressed, 256 times the bound.
BOMB = _bomb(256)
SMALL = {"choices": [{"message": {"content": "hello"}}]}


class _Handler(BaseHTTPRequestHandler):
    seen_accept_encoding: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/trickle":  # a byte every 0.1 s, each well within the read timeout, for 5 s
            self.send_response(200)
            self.send_header("Content-Length", "50")
            self.end_headers()
            for _ in range(50):
                self.wfile.write(b"t")
                self.wfile.flush()
                time.sleep(0.1)
            return
        type(self).seen_accept_encoding.append(self.headers.get("Accept-Encoding", ""))
        body, encoding = {
            "/big": (b"x" * (LIMIT * 3), None),
            "/bomb": (BOMB, "gzip"),
            "/small-gzip": (gzip.compress(b'{"ok": true}'), "gzip"),
            "/small-deflate": (zlib.compress(b'{"ok": "deflate"}'), "deflate"),
            "/brotli": (b"\x0b\x02\x80hello\x03", "br"),
            "/exact": (b"y" * LIMIT, None),
        }[self.path]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _client() -> httpx.Client:
    return guarded_client(allow=["127.0.0.1"], timeout=10.0, max_response_bytes=LIMIT)


def test_a_body_past_the_bound_ends_in_response_too_large(server: str) -> None:
    with _client() as http, pytest.raises(ResponseTooLarge, match=f"larger than {LIMIT} bytes"):
        http.get(f"{server}/big")
    with _client() as http:
        assert len(http.get(f"{server}/exact").content) == LIMIT  # at the bound exactly: whole


def test_a_gzip_bomb_is_stopped_at_the_bound_not_inflated(server: str) -> None:
    with _client() as http, pytest.raises(ResponseTooLarge):
        http.get(f"{server}/bomb")  # 256 MiB decompressed; stopped after LIMIT bytes of output
    assert len(BOMB) < LIMIT  # what came over the wire was under the bound


def test_compressed_answers_within_the_bound_read_as_usual_and_identity_is_asked(server: str) -> None:
    _Handler.seen_accept_encoding.clear()
    with _client() as http:
        answer = http.get(f"{server}/small-gzip")
        assert answer.json() == {"ok": True} and "content-encoding" not in answer.headers
        assert http.get(f"{server}/small-deflate").json() == {"ok": "deflate"}
    assert _Handler.seen_accept_encoding == ["identity", "identity"]


def test_an_encoding_it_cannot_bound_is_refused(server: str) -> None:
    with _client() as http, pytest.raises(ResponseTooLarge, match="'br'"):
        http.get(f"{server}/brotli")


def test_without_a_bound_nothing_changes(server: str) -> None:
    with guarded_client(allow=["127.0.0.1"], timeout=10.0) as http:
        answer = http.get(f"{server}/small-gzip")
        assert answer.json() == {"ok": True}
        assert len(http.get(f"{server}/big").content) == LIMIT * 3


def test_the_async_client_of_mcp_servers_is_bounded_alike(server: str) -> None:
    import anyio

    from egress.async_guard import AsyncResponseTooLarge, guarded_async_client

    async def get(path: str) -> bytes:
        async with guarded_async_client(allow=["127.0.0.1"], timeout=10.0, max_response_bytes=LIMIT) as http:
            return (await http.get(f"{server}{path}")).content

    for path in ("/big", "/bomb", "/brotli"):
        with pytest.raises(AsyncResponseTooLarge):
            anyio.run(get, path)
    assert anyio.run(get, "/small-gzip") == b'{"ok": true}'


def test_a_trickling_answer_is_cut_at_the_exchange_bound(server: str) -> None:
    # every byte arrives within the 2 s read timeout: only the exchange's bound (1 s of the answer's 5 s) cuts it
    with guarded_client(allow=["127.0.0.1"], timeout=2.0, max_exchange_seconds=1.0) as http, \
            pytest.raises(httpx.ReadTimeout, match="time bound"):
        http.get(f"{server}/trickle")
    with guarded_client(allow=["127.0.0.1"], timeout=2.0, max_exchange_seconds=30.0) as http:
        assert http.get(f"{server}/trickle").content == b"t" * 50
