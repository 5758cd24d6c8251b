"""Time to first delta (issue #18): from the provider's first chunk to the first ``message.delta`` frame a client reads
over SSE, and per delta from the chunk that completed its text. Live stack of tests/integration/test_run_stream.py
(embedded without DATABASE_URL/REDIS_URL, production with them), the fake OpenAI server streaming 60 pieces 20 ms
apart, 20 runs. Run: ``make bench-stream`` (pytest runs this module; it prints the figures).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx

from tests.conftest import django_db_setup  # noqa: F401 - the test database the live stack needs
from tests.integration import test_run_stream as live
from tests.integration.test_run_stream import WORDS, _parse, _start
from tests.support import fake_openai
from tests.support.fake_openai import text

fake = live.fake  # the streaming tests' fixtures: the fake provider, the live stack, two tenants
stack = live.stack
worlds = live.worlds


def test_time_to_first_delta(stack: Any, worlds: Any, fake: Any) -> None:
    world, _ = worlds
    sent: list[tuple[float, bytes]] = []
    original = fake_openai._Handler._chunk

    def chunk(self: Any, data: bytes) -> None:
        original(self, data)
        sent.append((time.monotonic(), data))

    fake_openai._Handler._chunk = chunk
    lat, first = [], []
    try:
        for _ in range(20):
            sent.clear()
            # the provider answers 0.5 s late, so the client has joined the run's stream before the first piece
            fake.script(text(WORDS, pieces=60, chunk_delay=0.02, delay=0.5), replace=True)
            run_id = _start(stack, world.raw_key)
            got: list[tuple[float, dict]] = []
            auth = {"Authorization": f"Bearer {world.raw_key}"}
            with httpx.Client(base_url=stack.base_url, headers=auth, timeout=30) as http, \
                    http.stream("GET", f"/api/v1/runs/{run_id}/stream") as r:
                for m in _parse(r.iter_lines()):
                    if "data" in m and m["data"]["type"] == "message.delta":
                        got.append((m["at"], m["data"]))
            import json
            cum, chunks = 0, []
            for at, data in sent:
                if b'"content": "' in data and b'"role"' not in data:
                    piece = json.loads(data.decode().removeprefix("data: ").strip())["choices"][0]["delta"]["content"]
                    cum += len(piece)
                    chunks.append((at, cum))
            total = chunks[-1][1]
            for at, d in got:
                end = d["offset"] + len(d["text"])
                release = next(t for t, c in chunks if c >= min(end, total))  # when its text had fully arrived
                lat.append((at - release) * 1000)
            assert got[0][1]["offset"] == 0, "the client joined after the first delta: not a first-delta measurement"
            first.append((got[0][0] - chunks[0][0]) * 1000)
    finally:
        fake_openai._Handler._chunk = original
    lat.sort()
    print("\nper-delta latency ms (chunk that completed its text -> SSE client, masking hold included): "
          f"n={len(lat)} p50={statistics.median(lat):.1f} "
          f"p95={lat[int(len(lat)*0.95)]:.1f} max={lat[-1]:.1f}")
    first.sort()
    print(f"first chunk -> first delta ms: p50={statistics.median(first):.1f} p95={first[int(len(first)*0.95)-1]:.1f}")
