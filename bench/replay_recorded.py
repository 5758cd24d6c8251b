"""Replaying recorded runs in ``recorded`` mode (issue #16): runs per second, and per-run overhead beside the original.

Seeds ``--runs`` (default 1,000) real runs of the order-desk demo agent (``tests.factories.make_world``: the planner
model asks for order/logistics tools, then answers) through the production path (``services.execute_run``: lease,
durable steps, audit, session turns), timing each: that is the *original* cost per run and per step. Then an
evaluation set of all of them is replayed on the same version in ``recorded`` mode through
``releases.services.run_shard`` -- the code the Celery task runs -- in this process (no broker: the replay's own
cost): recordings read per chunk of 200, each run driven through the runtime core with an in-memory store and the
cassette model/tools, diffs and checks computed, results bulk-inserted. The figures: runs/s, ms per replayed run and
per replayed step, beside ms per original run/step; the batch's pass rate must be 1.0 (zero diffs) or the figure
is void (the script says so and exits 1).

    make bench-replay              # or: .venv/bin/python bench/replay_recorded.py [--runs 1000] [--rounds 3]

Database ``agentops_bench_replay`` on ``BENCH_DATABASE_URL``'s / ``DATABASE_URL``'s server (else
``postgres://postgres@127.0.0.1:5432``), created and dropped here (``--keep-db`` keeps it). Nothing leaves
127.0.0.1. Results: stdout and ``bench/results/replay_recorded.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.step_overhead import bench_url, drop_database, recreate_database  # noqa: E402

BENCH_DB = "agentops_bench_replay"
QUESTIONS = ["Where is my order O202411280001?", "What is in order O202411280002?",
             "How much did orders O202411280001 and O202411280002 cost together?", "Hello, who are you?"]
DEFAULT_OUT = str(ROOT / "bench" / "results" / "replay_recorded.json")


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.pop("REDIS_URL", None)  # in-memory channel layer: the seeding's live publish is not what is measured
    os.environ.setdefault("DEBUG", "false")
    os.environ.setdefault("HTTPS_ONLY", "false")
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-0123456789abcdefghijklmnop")
    os.environ.setdefault("AGENTOPS_VAR_DIR", tempfile.mkdtemp(prefix="agentops-bench-replay-"))
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def seed(world: Any, runs: int) -> tuple[list[float], int]:
    """``runs`` real runs; their wall times (ms) and total steps."""
    from agents import services
    from agents.models import Run
    from tenants.scoping import Actor

    times = []
    for i in range(runs):
        run = services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text=QUESTIONS[i % len(QUESTIONS)])
        began = time.perf_counter()
        services.execute_run(str(run.pk))
        times.append((time.perf_counter() - began) * 1000)
    steps = sum(Run.objects.filter(tenant=world.tenant).values_list("step", flat=True))
    return times, steps


def replay_round(world: Any, name: str, chunk: int | None) -> dict[str, Any]:
    from releases import services as releases
    from releases.models import ReplayRun
    from tenants.scoping import actor_for_user

    actor = actor_for_user(world.operator)
    evaluation_set = releases.create_evaluation_set(tenant=world.tenant, actor=actor, name=name, agent=world.agent,
                                                    filters={"limit": releases.MAX_SET_RUNS})
    batch = releases.start_replay(tenant=world.tenant, actor=actor, evaluation_set=evaluation_set,
                                  candidate=world.version, concurrency=1, checks=[{"check": "no_diff"}])
    began = time.perf_counter()
    releases.run_shard(batch.pk, 0, 1)
    elapsed = time.perf_counter() - began
    batch.refresh_from_db()
    steps = sum(d["steps"]["replayed"] for d in ReplayRun.objects.filter(batch=batch).values_list("diff", flat=True))
    return {"runs": batch.done, "seconds": round(elapsed, 3), "runs_per_s": round(batch.done / elapsed, 1),
            "ms_per_run": round(elapsed * 1000 / batch.done, 3), "ms_per_step": round(elapsed * 1000 / max(steps, 1), 3),
            "pass_rate": batch.pass_rate, "status": batch.status, "steps": steps,
            "live_tool_calls": sum(ReplayRun.objects.filter(batch=batch).values_list("live_tool_calls", flat=True))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1000, help="Recorded runs to seed and replay (1..5000, default 1000).")
    parser.add_argument("--rounds", type=int, default=3, help="Replay rounds of the whole set (default 3).")
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--keep-db", action="store_true", help="Do not drop the benchmark database afterwards.")
    args = parser.parse_args()
    if not 1 <= args.runs <= 5000 or not 1 <= args.rounds <= 10:
        parser.error("--runs must be 1..5000 and --rounds 1..10")
    url = bench_url(BENCH_DB)
    server_version = recreate_database(url)
    try:
        setup_django(url)
        from django.db import connection

        from marketplace.builtin import order_desk
        from tests.factories import make_world

        world = make_world()
        print(f"seeding {args.runs} recorded runs through services.execute_run ...", flush=True)
        began = time.perf_counter()
        times, steps = seed(world, args.runs)
        order_desk.REFUNDS.clear()
        seeded_s = time.perf_counter() - began
        original = {"runs": args.runs, "steps": steps, "ms_per_run_median": round(statistics.median(times), 3),
                    "ms_per_run_mean": round(statistics.fmean(times), 3),
                    "ms_per_step": round(sum(times) / max(steps, 1), 3), "seconds": round(seeded_s, 1)}
        rounds = [replay_round(world, f"bench-{i}", None) for i in range(args.rounds)]
        void = [r for r in rounds if r["pass_rate"] != 1.0 or r["status"] != "finished" or r["live_tool_calls"]]
        median = sorted(rounds, key=lambda r: r["runs_per_s"])[len(rounds) // 2]
        print(f"\nreplay, recorded mode, {args.runs} runs ({steps} steps), PostgreSQL {server_version}, "
              f"{os.cpu_count()} CPUs, in-process run_shard\n")
        print(f"{'':28}{'runs/s':>10}{'ms/run':>10}{'ms/step':>10}")
        print(f"{'original (execute_run)':28}{1000 / original['ms_per_run_mean']:>10.1f}"
              f"{original['ms_per_run_mean']:>10.2f}{original['ms_per_step']:>10.2f}")
        for i, r in enumerate(rounds):
            print(f"{f'replay round {i + 1}':28}{r['runs_per_s']:>10.1f}{r['ms_per_run']:>10.2f}{r['ms_per_step']:>10.2f}"
                  f"   pass rate {r['pass_rate']}")
        ratio = round(median["ms_per_step"] / original["ms_per_step"], 3)
        print(f"\nmedian replay: {median['runs_per_s']} runs/s (goal >= 50); a replayed step costs {ratio}x an original "
              "step")
        document = {
            "benchmark": "replay_recorded", "database": f"PostgreSQL {server_version}",
            "python": platform.python_version(), "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
            "load_average": os.getloadavg(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "original": original, "rounds": rounds, "median_runs_per_s": median["runs_per_s"],
            "replayed_step_vs_original_step": ratio, "goal_runs_per_s": 50,
            "notes": "replay = releases.services.run_shard in this process (the Celery task's body), concurrency 1; "
                     "original = services.execute_run in this process (no broker either).",
        }
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"written {out}")
        connection.close()
        if void:
            print(f"VOID: a round did not reproduce every run exactly: {void}")
            sys.exit(1)
    finally:
        if not args.keep_db:
            drop_database(url)


if __name__ == "__main__":
    main()
