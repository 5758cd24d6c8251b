"""Issue #14, goal 1, on a live server: far more concurrent requests than database connections get answers, never
connection errors, and the server never holds more connections than its pool allows.

The server runs with a pool of 2 connections (``DB_POOL_MAX_SIZE=2``), a short wait for one and a short queue, and
takes waves of 16 times that many requests at once (reads of the run list, a run, its events; run creations). Each
answer must be a 2xx, or a 503/429 with ``Retry-After`` in the API's error body; no 500, no refused or dropped
connection. On PostgreSQL a sampler watches ``pg_stat_activity`` for the server's connections (tagged through libpq's
``PGAPPNAME``) throughout: at most the pool's 2 (one connection per request, as before the pool, reached dozens).
Afterwards the server still answers every request (no connection leaked from the pool). Both run modes run it: the
embedded stack (SQLite, no pool) must answer the same way.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from django.db import connection

from tests.factories import World, make_world
from tests.support.live_stack import LiveStack, make_live_stack

pytestmark = pytest.mark.integration

PRODUCTION = bool(os.environ.get("REDIS_URL"))  # as tests/support/live_stack.py decides the mode
POOL_SIZE = 2
IN_FLIGHT = 16 * POOL_SIZE
WAVES = 4
APP_NAME = f"agentops-pool-test-{os.getpid()}"
RUN = {"agent": "order-assistant", "input": "where is order O202411280001?"}


@pytest.fixture(scope="module")
def small_pool_stack(django_db_setup: Any) -> Iterator[LiveStack]:
    # Django's own handler runs every admitted request at once, each on a thread of its own: the pool runs short
    server_env = {"DB_POOL_MAX_SIZE": str(POOL_SIZE), "DB_POOL_MIN_SIZE": "1", "DB_POOL_TIMEOUT": "0.5",
                  "DB_POOL_MAX_WAITING": "4", "PGAPPNAME": APP_NAME}
    stack = make_live_stack({"API_THROTTLE_RATE": "off", "RUN_CREATE_THROTTLE_RATE": "off"}, server_env=server_env)
    try:
        yield stack
    finally:
        stack.stop()


class ConnectionSampler:
    """Counts the server's open PostgreSQL connections every 20 ms, in a thread, until stopped; keeps the peak."""

    def __init__(self) -> None:
        db = connection.settings_dict
        self.dsn = psycopg.conninfo.make_conninfo(dbname=db["NAME"], user=db.get("USER") or "postgres",
                                                  password=db.get("PASSWORD") or None, host=db.get("HOST") or "127.0.0.1",
                                                  port=db.get("PORT") or 5432)
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True, application_name="agentops-pool-test-sampler") as conn:
            while not self._stop.is_set():
                (count,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                                        [APP_NAME]).fetchone()  # type: ignore[misc]
                self.peak = max(self.peak, count)
                self.samples += 1
                self._stop.wait(0.02)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _verdict(response: httpx.Response | BaseException) -> str:
    """``ok``, ``told to retry`` (a 503/429 with Retry-After in the error body), or what was wrong."""
    if isinstance(response, BaseException):
        return f"transport error {type(response).__name__}: {response}"
    if 200 <= response.status_code < 300:
        return "ok"
    if response.status_code in (429, 503):
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return f"{response.status_code} without the error body: {response.text[:200]}"
        if int(response.headers.get("Retry-After", "0")) > 0 and code in ("dependency_unavailable", "throttled"):
            return "told to retry"
    return f"{response.status_code}: {response.text[:200]}"


async def _burst(stack: LiveStack, key: str, run_id: str) -> list[str]:
    paths = ["/api/v1/runs?limit=50", f"/api/v1/runs/{run_id}", f"/api/v1/runs/{run_id}/events?after=0"]
    limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT, keepalive_expiry=2.0)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, limits=limits, timeout=30) as http:

        async def one(i: int) -> httpx.Response:
            if i % 8 == 7:
                return await http.post("/api/v1/runs", json=RUN)
            return await http.get(paths[i % len(paths)])

        verdicts = []
        for _ in range(WAVES):
            answers = await asyncio.gather(*(one(i) for i in range(IN_FLIGHT)), return_exceptions=True)
            verdicts += [_verdict(a) for a in answers]
        return verdicts


def test_many_times_the_pool_size_of_concurrent_requests_get_answers_and_never_a_connection_error(
    small_pool_stack: LiveStack, django_db_blocker: Any
) -> None:
    with django_db_blocker.unblock():
        world: World = make_world()
    with small_pool_stack.client(world.raw_key) as http:
        created = http.post("/api/v1/runs", json=RUN)
        assert created.status_code == 202, created.text
        run_id = created.json()["id"]
    # when 16 times the pool's size of requests arrive at once, in waves
    if PRODUCTION:
        with django_db_blocker.unblock(), ConnectionSampler() as sampler:
            verdicts = asyncio.run(_burst(small_pool_stack, world.raw_key, run_id))
        # then the server never held more connections than its pool
        assert sampler.samples > 0 and 0 < sampler.peak <= POOL_SIZE, (sampler.peak, sampler.samples)
    else:
        verdicts = asyncio.run(_burst(small_pool_stack, world.raw_key, run_id))
    # and every request got an answer: a success, or a 503/429 telling it when to retry
    counts = Counter(verdicts)
    wrong = {verdict: n for verdict, n in counts.items() if verdict not in ("ok", "told to retry")}
    assert wrong == {}, f"{counts}; logs in {small_pool_stack.logdir}"
    assert counts["ok"] > 0, counts
    # and afterwards every connection is back in the pool: one request after another, all served
    with small_pool_stack.client(world.raw_key) as http:
        answers = [http.get(f"/api/v1/runs/{run_id}").status_code for _ in range(3 * POOL_SIZE)]
    assert answers == [200] * (3 * POOL_SIZE), answers
