"""Live trace fan-out: per-frame latency of one run's websocket trace to 1 and 50 viewers, ours vs raw Channels.

    make bench-trace        # or: .venv/bin/python bench/trace_fanout.py [--rounds 3 --viewers 1,50 --rate 24 --duration 20]

What it starts (and stops, by PID, also on Ctrl-C or an error): two uvicorn servers on 127.0.0.1 — our
application (``manage.py serve --no-worker``, PostgreSQL + Redis, channels_redis layer) and the raw Channels
peer (``bench/trace_peer.py``: a bare consumer joined to a group, same uvicorn, same layer settings) — and, per
phase, one child process holding the websocket viewers (so viewers and publisher do not share a GIL).

What it does per phase: a fresh run (ours) or group (peer); N viewers connect (ours: ``/ws/runs/<id>/?after=0``
with an API key; peer: ``/ws/peer/<group>/``) and say ready; then this process publishes events at ``--rate``
per second for ``--duration`` seconds, one committed step each, through the production path: the RunEvent row
and the run's ``last_seq`` in one transaction, ``agents.store.publish_after_commit`` (``core.live``) after
commit. The peer's events are committed the same way (same database work) and then sent with a plain
``group_send`` of the same frames. Latency of a frame = its receive time in a viewer − the moment its
transaction committed (both ``time.time()`` on this machine). Lost = seqs a viewer never got; duplicated =
seqs it got twice. Phases are interleaved: for each round, for each viewer count, ours then the peer.

The database is created and dropped (``--keep-db`` keeps it): ``BENCH_DATABASE_URL``, else ``DATABASE_URL``'s
server with the database ``agentops_bench_trace``, else ``postgres://postgres@127.0.0.1:5432/agentops_bench_trace``.
Redis: ``BENCH_REDIS_URL``, else ``REDIS_URL``, else ``redis://127.0.0.1:6379/9``.
Results: a table on stdout and ``bench/results/trace_fanout.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

BENCH_DB = "agentops_bench_trace"
MAX_VIEWERS = 200
MAX_SECONDS = 120.0
MAX_RATE = 200.0


# -- the viewers (a child process) -----------------------------------------------------------------


async def _viewer(url: str, headers: dict[str, str], expected: int, ready: asyncio.Event, go: asyncio.Event,
                  deadline_after_go: float, out: list[tuple[int, float]], spec_compression: bool) -> str:
    from websockets.asyncio.client import connect

    compression = "deflate" if spec_compression else None
    async with connect(url, additional_headers=headers, open_timeout=30, max_size=2**22, compression=compression) as ws:
        ready.set()
        seen_last_at: float | None = None
        deadline: float | None = None
        while True:
            now = time.monotonic()
            if go.is_set() and deadline is None:
                deadline = now + deadline_after_go
            limit = 1.0 if deadline is None else deadline - now
            if seen_last_at is not None:
                limit = min(limit, seen_last_at + 0.5 - now)  # linger briefly: a duplicate of the last frame counts
            if limit <= 0:
                return "ok" if seen_last_at is not None else "timeout"
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=limit)
            except TimeoutError:
                continue
            received = time.time()
            frame = json.loads(raw)
            seq = frame.get("seq")
            if not isinstance(seq, int):
                continue  # heartbeat
            out.append((seq, received))
            if seq >= expected and seen_last_at is None:
                seen_last_at = time.monotonic()


async def _viewers_main(spec: dict[str, Any]) -> None:
    n = spec["viewers"]
    outs: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    readies = [asyncio.Event() for _ in range(n)]
    go = asyncio.Event()
    tasks = [asyncio.create_task(_viewer(spec["url"], spec["headers"], spec["expected"], readies[i], go,
                                         spec["deadline"], outs[i], spec["compression"])) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), timeout=60)
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)  # the parent says when publishing started
    go.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"frames": outs, "results": [r if isinstance(r, str) else repr(r) for r in results]}), flush=True)


def viewers_child() -> None:
    spec = json.loads(sys.stdin.readline())
    asyncio.run(_viewers_main(spec))


# -- processes -------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Processes:
    """Every process this benchmark started, stopped by PID (its own process group) and nothing else."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[Any]] = {}

    def spawn(self, name: str, argv: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[Any]:
        if "stdout" not in kw:
            kw["stdout"] = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
            kw["stderr"] = subprocess.STDOUT
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, **kw)
        self.procs[name] = proc
        return proc

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), to compare the two servers' work independently of load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port: int, proc: subprocess.Popen[Any], log: Path, timeout: float = 45) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} during start-up:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {port} after {timeout}s; log: {log}")


# -- publishing (this process) ---------------------------------------------------------------------


class PeerPublisher:
    """A plain ``group_send`` from one long-lived event loop (what any Channels app would do)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="peer-publisher", daemon=True).start()

    def send(self, group: str, frames: list[dict[str, Any]]) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        asyncio.run_coroutine_threadsafe(layer.group_send(group, {"type": "run.events", "events": frames}), self.loop).result(5)


def payload(i: int) -> dict[str, Any]:
    """About the size of a tool step's event: a tool call's stage with arguments and a result preview."""
    return {
        "tool": "order_desk.query_order", "stage": "execute", "call_id": f"call_{i:06d}",
        "arguments": {"order_id": f"O2024112800{i % 100:02d}", "fields": ["status", "items", "totals", "logistics"]},
        "result_preview": "status=shipped carrier=SF Express tracking=SF1234567890 " * 3,
        "duration_ms": 12.5, "attempt": 1, "outcome": "ok",
    }


def commit_event(run: Any, i: int, committed: dict[int, float], peer: tuple[PeerPublisher, str] | None) -> None:
    """One step's commit as ``DjangoRunStore.commit_step`` does it (row lock, events, ``last_seq``), then the publish."""
    from django.db import transaction

    from agents.models import Run, RunEvent
    from agents.serializers import event_frames
    from agents.store import event_rows, publish_after_commit, run_summary
    from runtime.types import Event

    with transaction.atomic():
        locked = Run.objects.select_for_update().filter(pk=run.pk).values("last_seq").first()
        rows = event_rows(run, locked["last_seq"] + 1, i, [Event(type="tool.stage", payload=payload(i))])
        RunEvent.objects.bulk_create(rows)
        Run.objects.filter(pk=run.pk).update(last_seq=locked["last_seq"] + len(rows), step=i)
        run.last_seq, run.step = locked["last_seq"] + len(rows), i
        seqs = [r.seq for r in rows]

        def mark() -> None:
            now = time.time()
            for s in seqs:
                committed[s] = now

        transaction.on_commit(mark)  # registered first: runs first, right after the commit
        if peer is None:
            publish_after_commit(run, rows, run_summary(run))
        else:
            frames = event_frames(rows)
            publisher, group = peer
            transaction.on_commit(lambda: publisher.send(group, frames))


def new_run(world: Any) -> Any:
    from agents.models import Run, RunStatus, Session

    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    return Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session,
                              input="bench: trace fan-out", status=RunStatus.RUNNING)


# -- one phase -------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]  # nearest rank


def phase(kind: str, viewers: int, *, args: argparse.Namespace, world: Any, ports: dict[str, int], raw_key: str,
          procs: Processes, env: dict[str, str], peer: PeerPublisher) -> dict[str, Any]:
    expected = max(1, int(args.rate * (args.duration if viewers > 1 else args.duration_single)))
    if kind == "ours":
        run = new_run(world)
        url = f"ws://127.0.0.1:{ports['ours']}/ws/runs/{run.pk}/?after=0"
        headers = {"Authorization": f"Bearer {raw_key}"}
        target: tuple[PeerPublisher, str] | None = None
    else:
        run = new_run(world)  # the same database work per event, on a run nobody watches through our consumer
        name = uuid.uuid4().hex[:12]
        url = f"ws://127.0.0.1:{ports['peer']}/ws/peer/{name}/"
        headers = {}
        target = (peer, f"bench.peer.{name}")
    spec = {"url": url, "headers": headers, "viewers": viewers, "expected": expected,
            "deadline": expected / args.rate + args.drain, "compression": not args.no_compression}
    child = procs.spawn(f"viewers-{kind}-{viewers}", [sys.executable, __file__, "--viewers-child"], env,
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True)
    assert child.stdin and child.stdout
    child.stdin.write(json.dumps(spec) + "\n")
    child.stdin.flush()
    line = child.stdout.readline()
    if line.strip() != "READY":
        procs.stop(f"viewers-{kind}-{viewers}")
        raise RuntimeError(f"the viewers did not connect ({kind}, {viewers}): {line!r}")
    time.sleep(0.3)  # the last accept's backfill is done
    server_pid = procs.procs["server" if kind == "ours" else "peer"].pid
    cpu_before = cpu_seconds(server_pid)
    load = os.getloadavg()[0]
    committed: dict[int, float] = {}
    child.stdin.write("go\n")
    child.stdin.flush()
    start = time.monotonic()
    late = 0
    for i in range(1, expected + 1):
        due = start + (i - 1) / args.rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -0.05:
            late += 1
        commit_event(run, i, committed, target)
    publish_seconds = time.monotonic() - start
    out, _ = child.communicate(timeout=args.drain + 30)
    server_cpu = cpu_seconds(server_pid) - cpu_before
    procs.procs.pop(f"viewers-{kind}-{viewers}", None)
    data = json.loads(out.strip().splitlines()[-1])
    latencies: list[float] = []
    lost = dup = disorder = 0
    for frames in data["frames"]:
        seqs = [s for s, _ in frames]
        distinct = set(seqs)
        lost += len(set(range(1, expected + 1)) - distinct)
        dup += len(seqs) - len(distinct)
        disorder += sum(1 for a, b in itertools.pairwise(seqs) if b <= a)
        latencies += [(t - committed[s]) * 1000 for s, t in frames if s in committed]
    return {
        "kind": kind, "viewers": viewers, "events": expected, "publish_seconds": round(publish_seconds, 2),
        "rate": round(expected / publish_seconds, 1), "late_publishes": late, "frames": len(latencies),
        "p50": pct(latencies, 50), "p95": pct(latencies, 95), "p99": pct(latencies, 99), "max": max(latencies, default=float("nan")),
        "lost": lost, "duplicated": dup, "out_of_order": disorder, "load": round(load, 2),
        "server_cpu_ms_per_event": round(server_cpu * 1000 / expected, 3),
        "viewer_results": {r: data["results"].count(r) for r in set(data["results"])},
    }


# -- main ------------------------------------------------------------------------------------------


def mmm(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def mmm2(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def report(phases: list[dict[str, Any]], counts: list[int]) -> tuple[str, dict[str, Any]]:
    lines = ["| viewers | side | p50 ms | p95 ms | p99 ms | max ms | server CPU ms/event | lost | dup | out of order |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summary: dict[str, Any] = {}
    for n in counts:
        for kind in ("ours", "peer"):
            rows = [p for p in phases if p["viewers"] == n and p["kind"] == kind]
            if not rows:
                continue
            cells = [mmm([r[k] for r in rows]) for k in ("p50", "p95", "p99", "max")]
            cells.append(mmm2([r["server_cpu_ms_per_event"] for r in rows]))
            lost, dup, dis = (sum(r[k] for r in rows) for k in ("lost", "duplicated", "out_of_order"))
            lines.append(f"| {n} | {kind} | " + " | ".join(cells) + f" | {lost} | {dup} | {dis} |")
            summary[f"{kind}-{n}"] = {k: [r[k] for r in rows] for k in ("p50", "p95", "p99", "max", "lost", "duplicated",
                                                                      "server_cpu_ms_per_event", "load")}
        ours = [p for p in phases if p["viewers"] == n and p["kind"] == "ours"]
        peer = [p for p in phases if p["viewers"] == n and p["kind"] == "peer"]
        ratios = [o["p95"] / p["p95"] for o, p in zip(ours, peer, strict=False) if p["p95"] > 0]
        cpu_ratios = [o["server_cpu_ms_per_event"] / p["server_cpu_ms_per_event"] for o, p in zip(ours, peer, strict=False)
                      if p["server_cpu_ms_per_event"] > 0]
        if ratios and cpu_ratios:
            cell = " / ".join(f"{x:.2f}x" for x in (min(ratios), statistics.median(ratios), max(ratios)))
            cpu_cell = " / ".join(f"{x:.2f}x" for x in (min(cpu_ratios), statistics.median(cpu_ratios), max(cpu_ratios)))
            lines.append(f"| {n} | **ours/peer** (per round) | | {cell} | | | {cpu_cell} | | | |")
            summary[f"ratio-{n}"] = ratios
            summary[f"cpu-ratio-{n}"] = cpu_ratios
    lines.append("")
    lines.append("Cells: min / median / max across rounds. Lost, dup, out of order: totals over all rounds and viewers.")
    lines.append("Load average (1 min) at the start of each phase: " + ", ".join(
        f"{p['kind']}-{p['viewers']}: {p['load']}" for p in phases))
    return "\n".join(lines), summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--viewers", default="1,50", help="comma-separated viewer counts (default 1,50)")
    parser.add_argument("--rate", type=float, default=24.0, help="events per second (default 24)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of publishing per phase with >1 viewer")
    parser.add_argument("--duration-single", type=float, default=8.0, help="seconds of publishing per 1-viewer phase")
    parser.add_argument("--drain", type=float, default=10.0, help="seconds viewers wait for the last frames")
    parser.add_argument("--no-compression", action="store_true",
                        help="viewers do not offer permessage-deflate (browsers do; diagnosis only)")
    parser.add_argument("--only", choices=("ours", "peer"), help="run one side only (profiling)")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "trace_fanout.json"))
    args = parser.parse_args()
    if args.viewers_child:
        viewers_child()
        return
    counts = [int(c) for c in args.viewers.split(",") if c.strip()]
    if not (1 <= args.rounds <= 10 and all(1 <= c <= MAX_VIEWERS for c in counts) and 0 < args.rate <= MAX_RATE
            and 0 < args.duration <= MAX_SECONDS and 0 < args.duration_single <= MAX_SECONDS and 0 <= args.drain <= 60):
        sys.exit(f"bounds: 1-10 rounds, 1-{MAX_VIEWERS} viewers, rate <= {MAX_RATE}/s, durations <= {MAX_SECONDS}s, drain <= 60s")

    from step_overhead import bench_url, drop_database, recreate_database

    db_url = bench_url(BENCH_DB)
    redis_url = os.environ.get("BENCH_REDIS_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/9"
    if not redis_url.startswith("redis://127.0.0.1") and not redis_url.startswith("redis://localhost"):
        sys.exit(f"refusing a Redis that is not on 127.0.0.1: {redis_url}")
    pg_version = recreate_database(db_url)
    logdir = Path(tempfile.mkdtemp(prefix="agentops-bench-trace-"))
    secret = "bench-only-secret-key-" + uuid.uuid4().hex
    env = dict(os.environ)
    env.update(DATABASE_URL=db_url, REDIS_URL=redis_url, DEBUG="false", HTTPS_ONLY="false", SECRET_KEY=secret,
               AGENTOPS_VAR_DIR=str(logdir), LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="config.settings",
               PROMETHEUS_MULTIPROC_DIR=str(logdir / "prometheus"), AGENTOPS_QUEUE=f"agentops-bench-trace-{os.getpid()}",
               API_THROTTLE_RATE="off", RUN_CREATE_THROTTLE_RATE="off",
               # every viewer holds one of the API key's open streams (tenants/open_streams.py)
               MAX_OPEN_STREAMS_PER_KEY=str(MAX_VIEWERS), MAX_OPEN_STREAMS_PER_TENANT=str(MAX_VIEWERS))
    (logdir / "prometheus").mkdir()
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from tests.factories import make_world

    world = make_world("bench-trace")
    raw_key = world.raw_key
    procs = Processes(logdir)
    phases: list[dict[str, Any]] = []
    failed = False
    try:
        ports = {"ours": _free_port(), "peer": _free_port()}
        ours = procs.spawn("server", [sys.executable, "manage.py", "serve", "--no-worker", "--port", str(ports["ours"])], env)
        peer_srv = procs.spawn("peer", [sys.executable, "-m", "uvicorn", "--app-dir", "bench", "trace_peer:application",
                                        "--host", "127.0.0.1", "--port", str(ports["peer"]), "--ws", "websockets-sansio",
                                        "--lifespan", "off", "--log-level", "warning"], env)
        wait_port(ports["ours"], ours, logdir / "server.log")
        wait_port(ports["peer"], peer_srv, logdir / "peer.log")
        print(f"servers: ours pid {ours.pid} port {ports['ours']}, peer pid {peer_srv.pid} port {ports['peer']}; "
              f"logs in {logdir}", flush=True)
        publisher = PeerPublisher()
        sides = [args.only] if args.only else ["ours", "peer"]
        for r in range(1, args.rounds + 1):
            for n in counts:
                for kind in sides:
                    result = phase(kind, n, args=args, world=world, ports=ports, raw_key=raw_key, procs=procs, env=env, peer=publisher)
                    result["round"] = r
                    phases.append(result)
                    print(f"round {r} {kind:4} {n:3} viewers: p50 {result['p50']:.1f} p95 {result['p95']:.1f} "
                          f"p99 {result['p99']:.1f} max {result['max']:.1f} ms, lost {result['lost']}, dup {result['duplicated']}, "
                          f"rate {result['rate']}/s, server CPU {result['server_cpu_ms_per_event']} ms/event, load {result['load']}, "
                          f"viewers {result['viewer_results']}", flush=True)
                    time.sleep(1)
    except BaseException:
        failed = True
        raise
    finally:
        procs.stop_all()
        if not args.keep_db:
            from django.db import connections

            connections.close_all()
            drop_database(db_url)
        if failed:
            print(f"logs in {logdir}", file=sys.stderr)
    table, summary = report(phases, counts)
    print()
    print(table)
    meta = {"postgres": pg_version, "python": platform.python_version(), "cpus": os.cpu_count(),
            "rate": args.rate, "duration": args.duration, "duration_single": args.duration_single, "rounds": args.rounds}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "phases": phases, "summary": summary}, indent=2))
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
