"""The run reads' cost in one process, on PostgreSQL: the runs list (a page of 50), one run, its events page.

    .venv/bin/python bench/runs_read.py [--requests 300] [--rounds 3]

Requests go through Django's test client (the whole middleware, DRF, the serializers and the ORM; no server, no
network), so the figure is the application's own CPU per read. Each round times every path ``--requests`` times
and reports the median per request (wall and process CPU). The database is ``BENCH_DATABASE_URL`` (else
``DATABASE_URL``'s server with ``agentops_bench_reads``), created from scratch and dropped afterwards. Run it in
two trees one after the other to compare them (issue #51: before and after the compiled reads went).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.step_overhead import bench_url, drop_database, recreate_database, setup_django  # noqa: E402

RUNS = 50
EVENTS = 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = bench_url("agentops_bench_reads")
    recreate_database(url)
    try:
        setup_django(url)
        from django.conf import settings
        from django.utils import timezone

        from agents.models import Run, RunEvent, Session
        from tests.factories import make_world
        from tests.support.clients import bearer_client

        world = make_world("bench-reads")
        session = Session.objects.create(tenant=world.tenant, agent=world.agent)
        runs = [Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session,
                                   input=f"question {i}", usage={"input_tokens": 10, "output_tokens": 5})
                for i in range(RUNS)]
        RunEvent.objects.bulk_create([RunEvent(tenant=world.tenant, run=runs[0], seq=seq, step=seq // 5, type="tool.called",
                                               span_id=f"{seq:016x}", payload={"n": seq}, at=timezone.now())
                                      for seq in range(1, EVENTS + 1)])
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # the test client's host
        api = bearer_client(world.raw_key)
        paths = {"list": f"/api/v1/runs?limit={RUNS}", "detail": f"/api/v1/runs/{runs[0].pk}",
                 "events": f"/api/v1/runs/{runs[0].pk}/events?limit={EVENTS}"}
        for path in paths.values():
            for _ in range(20):
                answer = api.get(path)
                assert answer.status_code == 200, (path, answer.status_code, answer.content[:300])
        result: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
        for number in range(1, args.rounds + 1):
            for name, path in paths.items():
                wall, cpu = [], []
                for _ in range(args.requests):
                    w0, c0 = time.perf_counter(), time.process_time()
                    api.get(path)
                    cpu.append(time.process_time() - c0)
                    wall.append(time.perf_counter() - w0)
                figure = {"wall_ms": round(statistics.median(wall) * 1000, 3), "cpu_ms": round(statistics.median(cpu) * 1000, 3)}
                result[name].append(figure)
                print(f"round {number} {name:7} wall {figure['wall_ms']:.2f} ms  cpu {figure['cpu_ms']:.2f} ms", flush=True)
        print(json.dumps({name: statistics.median(r["wall_ms"] for r in rounds) for name, rounds in result.items()}))
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(url)


if __name__ == "__main__":
    main()
