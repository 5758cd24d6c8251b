"""Profile one live server process under a bounded load (issue #14, goal 2): where the per-request CPU goes.

    BENCH_DATABASE_URL=postgres://…/agentops_bench_api .venv/bin/python bench/api_profile.py [--seconds 20] [--rate 60]

Needs a database left by ``bench/api_load.py --keep-db`` (migrated, seeded, finished runs). Starts one
``manage.py serve --no-worker --workers 1`` and one Celery worker (each stopped by its PID), drives ``--rate`` reads/s
(+ a tenth as creates) to 127.0.0.1 with api_load's client, and samples the server with py-spy
(``pip install py-spy``; ``--gil``: only the thread holding the GIL, i.e. Python CPU, not I/O waits) into
``bench/results/api_profile.raw`` and its summary ``bench/results/api_profile.txt`` (top functions by self and by
inclusive samples). Bounded: at most 60 s of load.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api_load as al


def summarize(raw: Path, top: int = 40) -> str:
    """py-spy's raw (collapsed) stacks -> the top functions by self and by inclusive share of the samples."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [re.sub(r":\d+\)", ")", f) for f in stack.split(";")[1:]]  # drop the thread, then the line numbers
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            incl[frame] += n
    lines = [f"{total} samples", "== self"]
    lines += [f"{100 * n / total:5.1f}% {f}" for f, n in own.most_common(top)]
    lines += ["== inclusive"] + [f"{100 * n / total:5.1f}% {f}" for f, n in incl.most_common(top * 3)]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=60.0)
    parser.add_argument("--no-spy", action="store_true", help="only measure CPU per request")
    args = parser.parse_args()
    seconds = max(1.0, min(args.seconds, 60.0))
    url = al.database_url()
    workdir = Path(tempfile.mkdtemp(prefix="agentops-api-profile-"))
    port = al.free_port()
    env = al.stack_env(url, workdir, f"agentops-bench-profile-{port}", al.DEMO_KEY)
    procs = al.Processes(workdir, env)
    base = f"http://127.0.0.1:{port}"
    with psycopg.connect(url) as conn:
        run_ids = [str(r[0]) for r in conn.execute(
            "SELECT id FROM agents_run WHERE status = 'finished' ORDER BY created_at LIMIT 6").fetchall()]
    try:
        procs.start("worker", [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=threads",
                               "--concurrency=4", "-Q", env["AGENTOPS_QUEUE"], "--without-gossip", "--without-mingle",
                               "--loglevel=WARNING", "-n", f"bench-profile-{port}@%h"])
        procs.start("server", [sys.executable, "manage.py", "serve", "--no-worker", "--port", str(port),
                               "--workers", "1"])
        al.wait_healthy(base, procs)
        asyncio.run(al.drive(base, al.DEMO_KEY, run_ids, 3, args.rate, args.rate / 10))  # warm up
        pid = procs.procs["server"].pid
        spy = None
        out = al.ROOT / "bench" / "results" / "api_profile.raw"
        if not args.no_spy:
            spy_bin = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            spy = subprocess.Popen([spy_bin, "record", "--pid", str(pid), "--format", "raw", "--rate", "250",
                                    "--duration", str(int(seconds)), "--threads", "--output", str(out), "--nonblocking", "--gil"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cpu0 = al.cpu_seconds(pid)
        t0 = time.monotonic()
        result = asyncio.run(al.drive(base, al.DEMO_KEY, run_ids, seconds, args.rate, args.rate / 10))
        cpu = al.cpu_seconds(pid) - cpu0
        requests = sum(e["requests"] for e in result["endpoints"].values())
        errors = sum(e["errors"] for e in result["endpoints"].values())
        print(f"{requests} requests ({errors} errors) in {time.monotonic() - t0:.1f} s; server CPU "
              f"{cpu * 1000 / max(1, requests):.2f} ms/request; p50 "
              + ", ".join(f"{k} {v['p50_ms']:.1f}" for k, v in result["endpoints"].items())
              + "; statuses " + str({k: v.get("statuses") for k, v in result["endpoints"].items()}))
        if spy is not None:
            spy.wait(timeout=seconds + 30)
            summary = out.with_suffix(".txt")
            summary.write_text(summarize(out))
            print(f"py-spy samples in {out}, summary in {summary}")
    finally:
        procs.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
