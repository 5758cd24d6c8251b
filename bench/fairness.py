"""Fairness between tenants on the workers (issue #49 hole 6): one tenant's short runs, alone and while another
tenant saturates the worker with slow runs, in interleaved rounds of one run of this script.

Starts its own stack on PostgreSQL + Redis (an own database, dropped afterwards): one server process
(``manage.py serve --no-worker``) and one Celery worker (threads, ``--concurrency 4``: what ``make worker`` runs).
Tenant A (a tenant of its own) runs the slow test agent (``tests/support/slow_tools.py``: fetch, confirm, answer, each
tool call ``--slow-seconds``); tenant B is the demo tenant, running the two-step demo agent.

Each round: B alone (``--runs`` short runs, one after the other, POST -> finished), then A saturating (``--flood``
slow runs kept unfinished, topped up as they end) and B's ``--runs`` again, then A's runs cancelled and drained. The
figure: B's p50 / p95 alone and under A's load, and the ratio of the p95s (goal: at most 2). ``--bound`` sets the
deployment's TENANT_MAX_RUNNING (default: the deployment's default, 3); ``--bound 1000`` shows no bound at all.
Traffic goes to 127.0.0.1 only; every process started is stopped by its PID (also on SIGTERM).

    .venv/bin/python bench/fairness.py --rounds 3 --runs 10 --flood 12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_load import (
    ROOT,
    Processes,
    admin_url,
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
from throughput import wait_workers

RESULTS = ROOT / "bench" / "results" / "fairness.json"
DEFAULT_DB = "agentops_bench_fairness"
DEMO_KEY = "aok_7b0b7b0c_fairness-bench-secret-key-012345678901"
SHORT = {"agent": "order-assistant", "input": "where is order O202411280001?"}
SLOW = {"agent": "slow-agent", "input": "fetch the ticket for order O202411280001 and confirm the ticket"}

#: Tenant A: a tenant of its own with the slow test agent; prints its raw API key (run in ``manage.py shell``).
MAKE_TENANT_A = """
from agents.models import Agent, AgentVersion
from tests.factories import make_world
from tests.support import slow_tools
from tools.services import install_python_tool
world = make_world("bench-flood")
tools = [install_python_tool(tenant=world.tenant, key=k, actor=None) for k in slow_tools.SLOW_TOOL_KEYS]
agent = Agent.objects.create(tenant=world.tenant, slug="slow-agent", name="Slow agent")
version = AgentVersion.objects.create(tenant=world.tenant, agent=agent, number=1, model="demo/planner",
                                      tools=[t.name for t in tools], policy={"limits": {"max_recursion": 6}})
Agent.objects.filter(pk=agent.pk).update(current_version=version)
print("KEY", world.raw_key)
"""


async def finished_watch(url: str, waiting: dict[str, asyncio.Event], finished: dict[str, float],
                         stop: asyncio.Event, most: dict[str, int]) -> None:
    """Marks runs finished from the database (one query every 20 ms for all runs watched: no load on the API), and
    keeps the most of tenant A's runs a worker held at once (a live lease)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            row = await (await conn.execute(
                "SELECT count(*) FROM agents_run r JOIN tenants_tenant t ON t.id = r.tenant_id WHERE t.slug = 'bench-flood' "
                "AND r.status = 'running' AND r.lease_token <> '' AND r.lease_expires_at >= now()")).fetchone()
            most["a"] = max(most.get("a", 0), int(row[0]) if row else 0)
            ids = list(waiting)
            if ids:
                rows = await (await conn.execute(
                    "SELECT id::text FROM agents_run WHERE id = ANY(%s::uuid[]) AND status = 'finished'", [ids])).fetchall()
                now = time.monotonic()
                for (run_id,) in rows:
                    finished[run_id] = now
                    waiting.pop(run_id).set()
            await asyncio.sleep(0.02)


async def phase(base: str, url: str, key_a: str, runs: int, flood: int) -> dict[str, Any]:
    """B's ``runs`` short runs one after the other (POST -> finished, ms); with ``flood``, while A keeps that many
    slow runs unfinished. A's runs are cancelled at the end and drained before the next phase."""
    waiting: dict[str, asyncio.Event] = {}
    finished: dict[str, float] = {}
    stop, stop_flood = asyncio.Event(), asyncio.Event()
    most: dict[str, int] = {}
    watcher = asyncio.create_task(finished_watch(url, waiting, finished, stop, most))
    flooding = asyncio.Event()
    a_runs: list[str] = []
    b_runs: list[str] = []
    latencies: list[float] = []

    async def post(http: httpx.AsyncClient, body: dict[str, Any]) -> str:
        response = await http.post("/api/v1/runs", json=body)
        response.raise_for_status()
        run_id = str(response.json()["id"])
        waiting[run_id] = asyncio.Event()
        return run_id

    async def flood_a(http: httpx.AsyncClient) -> None:
        while not stop_flood.is_set():
            unfinished = [r for r in a_runs if r not in finished]
            for _ in range(flood - len(unfinished)):
                a_runs.append(await post(http, SLOW))
            flooding.set()
            await asyncio.sleep(0.1)

    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {DEMO_KEY}"}, timeout=30) as b_http, \
            httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key_a}"}, timeout=30) as a_http:
        flooder = asyncio.create_task(flood_a(a_http)) if flood else None
        if flooder is not None:
            await flooding.wait()
            await asyncio.sleep(1.0)  # A's first runs hold their places, the rest are parked
        for _ in range(runs):
            start = time.monotonic()
            run_id = await post(b_http, SHORT)
            b_runs.append(run_id)
            await asyncio.wait_for(waiting[run_id].wait(), 120)
            latencies.append((finished[run_id] - start) * 1000)
        if flooder is not None:
            stop_flood.set()
            await flooder
            for run_id in a_runs:
                if run_id not in finished:
                    await a_http.post(f"/api/v1/runs/{run_id}/cancel")
            await asyncio.wait_for(asyncio.gather(*(e.wait() for r, e in list(waiting.items()) if r in a_runs)), 120)
    stop.set()
    await watcher
    with psycopg.connect(url) as conn:  # where B's time went: waiting for a worker slot, or executing
        rows = conn.execute("SELECT extract(epoch FROM started_at - created_at) * 1000 FROM agents_run "
                            "WHERE id = ANY(%s::uuid[])", [b_runs]).fetchall()
    return {"b_ms": latencies, "b_queue_ms": [float(r[0]) for r in rows if r[0] is not None], "a_runs": len(a_runs),
            "a_most_at_once": most.get("a", 0)}


def stats(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": round(statistics.median(values), 1), "p95": round(percentile(values, 95), 1),
            "max": round(max(values), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=10, help="B's short runs per phase (at most 100)")
    parser.add_argument("--flood", type=int, default=12, help="A's slow runs kept unfinished under load (at most 50)")
    parser.add_argument("--slow-seconds", type=float, default=2.0, help="each of A's two slow tool calls")
    parser.add_argument("--bound", type=int, default=0, help="TENANT_MAX_RUNNING (0: the deployment's default)")
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args()
    rounds, runs, flood = max(1, min(args.rounds, 10)), max(2, min(args.runs, 100)), max(1, min(args.flood, 50))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    url = database_url(DEFAULT_DB)
    workdir = Path(tempfile.mkdtemp(prefix="agentops-fairness-"))
    port = free_port()
    env = stack_env(url, workdir, f"agentops-bench-fair-{port}", DEMO_KEY)
    env.update(AGENTOPS_EXTRA_TOOL_MODULES="tests.support.slow_tools", TEST_SLOW_TOOL_SECONDS=str(args.slow_seconds),
               RUN_LEASE_SECONDS="30")
    if args.bound:
        env["TENANT_MAX_RUNNING"] = str(args.bound)
    procs = Processes(workdir, env)
    base = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {"rounds": [], "runs": runs, "flood": flood, "slow_seconds": args.slow_seconds,
                              "bound": args.bound or "default", "worker_threads": 4}
    try:
        with database(url, args.keep_db):
            log(f"database {db_name(url)} (admin {urlsplit(admin_url(url)).hostname}): migrate, seed_demo, tenant A")
            run_manage(env, "migrate", "--noinput")
            run_manage(env, "seed_demo")
            key_a = next(line.split()[1] for line in run_manage(env, "shell", "-c", MAKE_TENANT_A).splitlines()
                         if line.startswith("KEY "))
            procs.start("server", [sys.executable, "manage.py", "serve", "--no-worker", "--port", str(port), "--workers", "1"])
            procs.start("worker", [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=threads",
                                   "--concurrency=4", "-Q", env["AGENTOPS_QUEUE"], "--without-gossip", "--without-mingle",
                                   "--loglevel=WARNING", "-n", f"bench-fair-{port}@%h"])
            wait_healthy(base, procs)
            wait_workers(base, 1)
            asyncio.run(phase(base, url, key_a, 3, 0))  # warm-up
            for number in range(1, rounds + 1):
                solo = asyncio.run(phase(base, url, key_a, runs, 0))
                loaded = asyncio.run(phase(base, url, key_a, runs, flood))
                procs.check()
                entry = {"round": number, "solo": stats(solo["b_ms"]), "loaded": stats(loaded["b_ms"]),
                         "solo_queue_ms": stats(solo["b_queue_ms"]), "loaded_queue_ms": stats(loaded["b_queue_ms"]),
                         "a_runs": loaded["a_runs"], "a_most_at_once": loaded["a_most_at_once"],
                         "solo_ms": solo["b_ms"], "loaded_ms": loaded["b_ms"]}
                result["rounds"].append(entry)
                log(f"round {number}: B alone {entry['solo']} (queue {entry['solo_queue_ms']}), B while A floods "
                    f"{entry['loaded']} (queue {entry['loaded_queue_ms']}) "
                    f"(A posted {loaded['a_runs']}, at most {loaded['a_most_at_once']} running at once)")
    finally:
        procs.stop_all()
    solo_all = [v for r in result["rounds"] for v in r["solo_ms"]]
    loaded_all = [v for r in result["rounds"] for v in r["loaded_ms"]]
    result["solo"], result["loaded"] = stats(solo_all), stats(loaded_all)
    result["p95_ratio"] = round(result["loaded"]["p95"] / result["solo"]["p95"], 2)
    result["goal_met"] = result["p95_ratio"] <= 2.0
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"\n{'round':>5} {'B alone p50/p95 ms':>20} {'B under A p50/p95 ms':>22} {'p95 ratio':>9}")
    for r in result["rounds"]:
        print(f"{r['round']:>5} {r['solo']['p50']:>9} / {r['solo']['p95']:<8} {r['loaded']['p50']:>10} / "
              f"{r['loaded']['p95']:<9} {r['loaded']['p95'] / r['solo']['p95']:>9.2f}")
    print(f"{'all':>5} {result['solo']['p50']:>9} / {result['solo']['p95']:<8} {result['loaded']['p50']:>10} / "
          f"{result['loaded']['p95']:<9} {result['p95_ratio']:>9.2f}   goal (<= 2x): {'met' if result['goal_met'] else 'NOT met'}")
    log(f"logs in {workdir}; results in {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
