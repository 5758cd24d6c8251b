"""Time to first delta (issue #18): from the provider's first chunk to the first ``message.delta`` frame a client reads
over SSE, and per delta from the chunk that completed its text. The streaming tests' live stack
(tests/support/stream_stack.py; embedded without DATABASE_URL/REDIS_URL, production with them), the fake OpenAI server
answering at once and streaming 60 pieces 20 ms apart, each run created and streamed in one call (its stream joins the
run's feed before the run is enqueued), 20 runs. Run: ``make bench-stream`` (pytest runs this module; it prints the
figures).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx

from tests.conftest import django_db_setup  # noqa: F401 - the test database the live stack needs
from tests.integration.test_run_stream import _parse
from tests.support import fake_openai, stream_stack
from tests.support.fake_openai import text
from tests.support.stream_stack import WORDS

fake = stream_stack.fake  # the streaming tests' fixtures: the fake provider, the live stack, two tenants
stack = stream_stack.stack
worlds = stream_stack.worlds


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
            # the provider answers at once: the create streams the run, its stream joined before the run is enqueued
            fake.script(text(WORDS, pieces=60, chunk_delay=0.02), replace=True)
            got: list[tuple[float, dict]] = []
            auth = {"Authorization": f"Bearer {world.raw_key}", "Accept": "text/event-stream"}
            body = {"agent": "order-assistant", "input": "where is order O202411280001?"}
            with httpx.Client(base_url=stack.base_url, headers=auth, timeout=30) as http, \
                    http.stream("POST", "/api/v1/runs", json=body) as r:
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
            assert got[0][1]["offset"] == 0, "the first delta was published before the stream joined"
            first.append((got[0][0] - chunks[0][0]) * 1000)
    finally:
        fake_openai._Handler._chunk = original
    lat.sort()
    print("\nper-delta latency ms (chunk that completed its text -> SSE client, masking hold included): "
          f"n={len(lat)} p50={statistics.median(lat):.1f} "
          f"p95={lat[int(len(lat)*0.95)]:.1f} max={lat[-1]:.1f}")
    first.sort()
    print(f"first chunk -> first delta ms: p50={statistics.median(first):.1f} p95={first[int(len(first)*0.95)-1]:.1f}")
