"""Issue #13 on a live stack: with Redis down, a run is still accepted (202) and it runs, once, when Redis is back.

The stack's server and worker reach Redis through a TCP proxy this test cuts (listening socket closed, live
connections dropped: clients get "connection refused") and restores on the same port; the machine's Redis is never
touched. The sweeper runs as ``manage.py sweep_runs`` (cron's way) once Redis is back. Production mode only: the
embedded stack has no Redis to lose (tests/db/test_acceptance.py covers the broker refusing in process).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from agents.models import Run
from tests.factories import World, make_world
from tests.support.live_stack import ROOT, LiveStack, make_live_stack

pytestmark = pytest.mark.integration


class CuttableProxy:
    """127.0.0.1:<port> forwarding to ``target``; ``cut()`` makes the port refuse connections until ``restore()``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._live: set[socket.socket] = set()
        self._lock = threading.Lock()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            live, self._live = self._live, set()
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._live.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


PRODUCTION = bool(os.environ.get("REDIS_URL"))  # as tests/support/live_stack.py decides the mode


@pytest.fixture(scope="module")
def redis_proxy() -> Iterator[CuttableProxy | None]:
    if not PRODUCTION:
        yield None
        return
    real = urlsplit(os.environ["REDIS_URL"])
    proxy = CuttableProxy((real.hostname or "127.0.0.1", real.port or 6379))
    proxy.restore()
    yield proxy
    proxy.cut()


@pytest.fixture(scope="module")
def outage_stack(redis_proxy: CuttableProxy | None, django_db_setup: Any) -> Iterator[LiveStack | None]:
    """A stack of its own (server + worker) whose Redis is the proxy; a queued run is swept after 1 s."""
    if redis_proxy is None:
        yield None
        return
    real = urlsplit(os.environ["REDIS_URL"])
    url = real._replace(netloc=f"{real.username + '@' if real.username else ''}127.0.0.1:{redis_proxy.port}").geturl()
    stack = make_live_stack({"REDIS_URL": url, "SWEEP_QUEUED_AFTER_SECONDS": "1", "REDIS_CONNECT_TIMEOUT": "2"})
    try:
        yield stack
    finally:
        stack.stop()


def _sweep(stack: LiveStack) -> str:
    done = subprocess.run([sys.executable, "manage.py", "sweep_runs"], cwd=ROOT, env=stack.env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_with_redis_down_a_run_is_accepted_and_runs_once_when_redis_is_back(
    redis_proxy: CuttableProxy | None, outage_stack: LiveStack | None, django_db_blocker: Any
) -> None:
    if outage_stack is None or redis_proxy is None:
        assert not PRODUCTION  # embedded mode: nothing to cut, the broker lives in the server's memory
        return
    with django_db_blocker.unblock():
        world: World = make_world()
    key = f"outage-{uuid.uuid4()}"
    body = {"agent": "order-assistant", "input": "where is order O202411280001?"}
    # given Redis is down (the broker, the rate limits' counters, the channel layer)
    redis_proxy.cut()
    try:
        with outage_stack.client(world.raw_key) as http:
            health = http.get("/healthz")
            assert health.status_code == 503 and "broker" in health.json()["down"], health.text
            assert int(health.headers["Retry-After"]) > 0
            # when a client starts a run: accepted, queued; its retry with the same key is the same run
            started = http.post("/api/v1/runs", json=body, headers={"Idempotency-Key": key})
            assert started.status_code == 202, started.text
            run_id = started.json()["id"]
            again = http.post("/api/v1/runs", json=body, headers={"Idempotency-Key": key})
            assert again.status_code == 202 and again.json()["id"] == run_id
            assert again.headers["Idempotent-Replayed"] == "true"
            assert http.get(f"/api/v1/runs/{run_id}").json()["status"] == "queued"
    finally:
        redis_proxy.restore()
    # then, Redis back, nothing delivers the run but the sweeper (here after SWEEP_QUEUED_AFTER_SECONDS = 1 s) ...
    time.sleep(3)
    with django_db_blocker.unblock():
        assert Run.objects.get(pk=run_id).status == "queued"
    assert "queued without a worker" in _sweep(outage_stack)
    # ... and it runs, once
    finished = outage_stack.wait_for_run(world.raw_key, run_id, timeout=60)
    assert finished["terminal_reason"] == "final_answer", finished
    with django_db_blocker.unblock():
        assert Run.objects.filter(tenant=world.tenant).count() == 1
        assert Run.objects.get(pk=run_id).crash_count == 0
    with httpx.Client(base_url=outage_stack.base_url, timeout=10) as http:
        assert http.get("/healthz").json()["checks"]["broker"]["ok"]
