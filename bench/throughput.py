"""End-to-end throughput of the two-step demo agent: runs/s at N in flight, POST -> finished, and where the time goes.

Issue #14 goal 4. Starts its own stack on PostgreSQL + Redis (an own database, dropped afterwards): one server
process (``manage.py serve --no-worker``) and, per phase, Celery workers (threads): a phase per worker process count
given with ``--worker-processes`` (default ``1,2``) and thread count given with ``--concurrency`` (default ``4,8``:
what ``make worker`` runs, and twice that). Each phase sends ``--runs`` demo runs (``POST /api/v1/runs``) keeping
``--in-flight`` of them unfinished at a time, and watches them finish from the database (one query every 20 ms for all
runs in flight, so watching costs the API nothing).

Per run: POST -> finished as the client sees it, and from the run's row the queue wait (``created_at`` ->
``started_at``: the task waiting for a worker thread) and the execution (``started_at`` -> ``finished_at``).
Traffic goes to 127.0.0.1 only; every process started is stopped by its PID (also on SIGTERM).

    .venv/bin/python bench/throughput.py --runs 120 --in-flight 20 --concurrency 4,8 --worker-processes 1,2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from urllib.parse import urlsplit

from api_load import (
    ROOT,
    Processes,
    admin_url,
    cpu_seconds,
    database,
    database_url,
    db_name,
    free_port,
    log,
    percentile,
    run_manage,
    stack_env,
    wait_healthy,
)

RESULTS = ROOT / "bench" / "results" / "throughput.json"
DEFAULT_DB = "agentops_bench_throughput"
DEMO_KEY = "aok_7b0b7b0b_throughput-bench-secret-key-0123456789"
RUN = {"agent": "order-assistant", "input": "where is order O202411280001?"}


async def drive(base: str, url: str, runs: int, in_flight: int) -> dict[str, Any]:
    posted: dict[str, float] = {}
    answered: list[float] = []
    finished: dict[str, float] = {}
    waiting: dict[str, asyncio.Event] = {}
    errors = 0
    slots = asyncio.Semaphore(in_flight)
    done_posting = asyncio.Event()

    async def watch() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while not (done_posting.is_set() and not waiting):
                ids = list(waiting)
                if ids:
                    rows = await (await conn.execute(
                        "SELECT id::text FROM agents_run WHERE id = ANY(%s::uuid[]) AND status = 'finished'", [ids])).fetchall()
                    now = time.monotonic()
                    for (run_id,) in rows:
                        finished[run_id] = now
                        waiting.pop(run_id).set()
                await asyncio.sleep(0.02)

    async def one(http: httpx.AsyncClient) -> None:
        nonlocal errors
        async with slots:
            start = time.monotonic()
            response = await http.post("/api/v1/runs", json=RUN)
            if response.status_code != 202:
                errors += 1
                return
            run_id = response.json()["id"]
            answered.append((time.monotonic() - start) * 1000)
            posted[run_id] = start
            event = waiting[run_id] = asyncio.Event()
            await asyncio.wait_for(event.wait(), 120)

    watcher = asyncio.create_task(watch())
    began = time.monotonic()
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {DEMO_KEY}"}, timeout=30) as http:
        await asyncio.gather(*(one(http) for _ in range(runs)))
    done_posting.set()
    await watcher
    elapsed = max(finished.values(), default=began) - began
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM started_at - created_at), extract(epoch FROM finished_at - started_at) "
            "FROM agents_run WHERE id = ANY(%s::uuid[])", [list(posted)]).fetchall()
    queue = [float(r[0]) * 1000 for r in rows if r[0] is not None]
    execution = [float(r[1]) * 1000 for r in rows if r[1] is not None]
    total = [(finished[r] - posted[r]) * 1000 for r in posted if r in finished]
    return {
        "runs": len(total), "errors": errors, "seconds": round(elapsed, 2), "runs_per_s": round(len(total) / elapsed, 2),
        "post_to_finished_ms": _stats(total), "post_answered_ms": _stats(answered), "queue_ms": _stats(queue),
        "execution_ms": _stats(execution),
    }


def wait_workers(base: str, count: int, timeout: float = 60) -> None:
    """Until the server's health check has seen ``count`` workers (each reports itself a few seconds after start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        detail = str(httpx.get(f"{base}/healthz", timeout=3).json()["checks"]["workers"].get("detail", ""))
        if detail.split(" ")[0].isdigit() and int(detail.split(" ")[0]) >= count:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the server did not see {count} workers within {timeout}s")


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": round(statistics.median(values), 1), "p95": round(percentile(values, 95), 1),
            "max": round(max(values), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=120, help="runs per phase (at most 1000)")
    parser.add_argument("--in-flight", type=int, default=20)
    parser.add_argument("--concurrency", default="4,8", help="worker thread counts, a phase each (default 4,8)")
    parser.add_argument("--worker-processes", default="1,2",
                        help="Celery worker process counts, each with every --concurrency (default 1,2: one process, "
                             "and two, which on two cores take up what one process's threads leave idle; at most 4)")
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args()
    runs, in_flight = max(1, min(args.runs, 1000)), max(1, min(args.in_flight, 100))
    phases = [(max(1, min(int(w), 4)), max(1, min(int(c), 32)))
              for w in args.worker_processes.split(",") if w.strip()
              for c in args.concurrency.split(",") if c.strip()]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    url = database_url(DEFAULT_DB)
    workdir = Path(tempfile.mkdtemp(prefix="agentops-throughput-"))
    port = free_port()
    env = stack_env(url, workdir, f"agentops-bench-tp-{port}", DEMO_KEY)
    procs = Processes(workdir, env)
    base = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {"runs": runs, "in_flight": in_flight, "phases": []}
    try:
        with database(url, args.keep_db):
            log(f"database {db_name(url)} (admin {urlsplit(admin_url(url)).hostname}): migrate, seed_demo")
            run_manage(env, "migrate", "--noinput")
            run_manage(env, "seed_demo")
            procs.start("server", [sys.executable, "manage.py", "serve", "--no-worker", "--port", str(port), "--workers", "1"])
            for workers, concurrency in phases:
                names = [f"worker{i}" for i in range(workers)]
                for i, name in enumerate(names):
                    procs.start(name, [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=threads",
                                       f"--concurrency={concurrency}", "-Q", env["AGENTOPS_QUEUE"], "--without-gossip",
                                       "--without-mingle", "--loglevel=WARNING",
                                       "-n", f"bench-tp-{port}-{workers}x{concurrency}-{i}@%h"])
                wait_healthy(base, procs)  # the server is up and sees a worker
                wait_workers(base, workers)
                asyncio.run(drive(base, url, min(5, runs), min(5, in_flight)))  # warm-up

                def worker_cpu_total() -> float:
                    return sum(cpu_seconds(procs.procs[name].pid) for name in names)  # noqa: B023

                server_cpu, worker_cpu = cpu_seconds(procs.procs["server"].pid), worker_cpu_total()
                load = os.getloadavg()[0]
                phase = asyncio.run(drive(base, url, runs, in_flight))
                phase.update(concurrency=concurrency, worker_processes=workers, load_average=round(load, 1),
                             server_cpu_ms_per_run=round((cpu_seconds(procs.procs["server"].pid) - server_cpu) * 1000 / runs, 1),
                             worker_cpu_ms_per_run=round((worker_cpu_total() - worker_cpu) * 1000 / runs, 1))
                procs.check()
                for name in names:
                    procs.stop(name)
                result["phases"].append(phase)
                log(f"worker processes {workers} x threads {concurrency}: {json.dumps(phase)}")
    finally:
        procs.stop_all()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"\n{'processes':>9} {'threads':>7} {'runs/s':>7} {'POST->finished p50/p95 ms':>26} {'queue p50/p95 ms':>18} "
          f"{'exec p50/p95 ms':>17} {'worker cpu ms/run':>18}")
    for p in result["phases"]:
        print(f"{p['worker_processes']:>9} {p['concurrency']:>7} {p['runs_per_s']:>7} {p['post_to_finished_ms']['p50']:>12} / "
              f"{p['post_to_finished_ms']['p95']:<11} {p['queue_ms']['p50']:>8} / {p['queue_ms']['p95']:<7} "
              f"{p['execution_ms']['p50']:>7} / {p['execution_ms']['p95']:<7} {p['worker_cpu_ms_per_run']:>18}")
    log(f"logs in {workdir}; results in {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
