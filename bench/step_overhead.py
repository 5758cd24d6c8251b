"""What one agent step costs the durable side: time, queries, commits and bytes written, on PostgreSQL.

A 10-step run: a zero-latency scripted model asks for a trivial tool 9 times, then answers. It goes
through the production path, ``services.execute_run`` (lease, ``engine.build_loop``, the real
DjangoRunStore and ToolGateway, audit chain, publish after commit); only the model client is the
scripted one. The run's session is pre-filled with earlier turns so its conversation holds 10 or
100 messages of history before the run starts.

Per step it records wall time, SQL statements, transactions (commits plus autocommitted writes)
and the bytes of text/JSON that INSERT/UPDATE statements carry, split by table.

    make bench                       # or: .venv/bin/python bench/step_overhead.py [--runs 30]

The database is created from scratch (and dropped afterwards unless ``--keep-db``):
``BENCH_DATABASE_URL``, else ``DATABASE_URL``'s server with the database ``agentops_bench``, else
``postgres://postgres@127.0.0.1:5432/agentops_bench``. ``REDIS_URL`` is honoured (Redis channel
layer for the live publish, as in production); unset, the in-memory layer is used.
Results: a table on stdout and ``bench/results/step_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BENCH_DB = "agentops_bench"
STEPS = 10
TABLE_RE = re.compile(r'^\s*(?:INSERT\s+INTO|UPDATE)\s+"?([A-Za-z0-9_]+)"?', re.IGNORECASE)


def bench_url(bench_db: str = BENCH_DB) -> str:
    """BENCH_DATABASE_URL, else DATABASE_URL's server with ``bench_db``, else a local server with ``bench_db``."""
    if os.environ.get("BENCH_DATABASE_URL"):
        return os.environ["BENCH_DATABASE_URL"]
    base = os.environ.get("DATABASE_URL", "")
    if base.startswith(("postgres://", "postgresql://")):
        # Same server and credentials, but never the application's own database: this one is dropped.
        parts = urlsplit(base)
        return urlunsplit((parts.scheme, parts.netloc, f"/{bench_db}", "", ""))
    return f"postgres://postgres@127.0.0.1:5432/{bench_db}"


def recreate_database(url: str) -> str:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not re.fullmatch(r"[A-Za-z0-9_]+", name) or "bench" not in name:
        sys.exit(f"refusing to drop {name!r}: the benchmark database's name must contain 'bench' (set BENCH_DATABASE_URL)")
    admin = urlunsplit((parts.scheme.replace("postgresql", "postgres"), parts.netloc, "/postgres", "", ""))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
        version = conn.execute("SHOW server_version").fetchone()
    return str(version[0]) if version else "?"


def drop_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    admin = urlunsplit((parts.scheme, parts.netloc, "/postgres", "", ""))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parts.path.lstrip("/")}" WITH (FORCE)')


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DEBUG", "false")
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-0123456789abcdefghijklmnop")
    os.environ.setdefault("AGENTOPS_VAR_DIR", tempfile.mkdtemp(prefix="agentops-bench-"))
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


# -- measuring ------------------------------------------------------------------------------------


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, list | tuple):  # PostgreSQL's bulk insert passes a column as an array (UNNEST)
        return sum(_size(v) for v in value)
    if hasattr(value, "obj"):  # psycopg's Json/Jsonb wrapper around a JSONField value
        return len(json.dumps(value.obj, default=str).encode())
    return 0


@dataclass
class Slice:
    seconds: float = 0.0
    commit_seconds: float = 0.0
    queries: int = 0
    transactions: int = 0
    written: int = 0
    by_table: Counter[str] = field(default_factory=Counter)


class Meter:
    """Statements, transactions and bytes written, cut into slices at each model call (= each step)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.slices: list[Slice] = [Slice()]
        self.started = time.perf_counter()
        self.writes: list[tuple[Slice, str, Any, bool]] = []  # sized after the run, so sizing costs no step time

    def cut(self) -> None:
        now = time.perf_counter()
        self.slices[-1].seconds = now - self.started
        self.started = now
        self.slices.append(Slice())

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        current = self.slices[-1]
        current.queries += 1
        head = sql.lstrip()[:6].upper()
        if head in ("INSERT", "UPDATE") or (head.startswith("WITH") and ("INSERT INTO" in sql or "UPDATE " in sql)):
            if not self.connection.in_atomic_block:
                current.transactions += 1  # an autocommitted write is a transaction of its own
            self.writes.append((current, sql, params, many))
        return execute(sql, params, many, context)

    def committed(self) -> None:
        self.slices[-1].transactions += 1

    def size_writes(self) -> None:
        for current, sql, params, many in self.writes:
            match = TABLE_RE.match(sql)
            if params and match:
                size = sum(_size(p) for row in (params if many else [params]) for p in row)
                current.written += size
                current.by_table[match.group(1)] += size


# -- the run --------------------------------------------------------------------------------------


@dataclass
class World:
    tenant: Any
    agent: Any
    version: Any


def make_world() -> World:
    from agents.models import Agent, AgentVersion
    from tenants.models import Tenant
    from tools.pyfunc import registry, tool
    from tools.services import install_python_tool

    if "bench.echo" not in registry:

        @tool(key="bench.echo", category="read")
        def echo(n: int) -> dict[str, Any]:
            """Return the number it is given (a trivial tool for the benchmark)."""
            return {"n": n}

    tenant = Tenant.objects.create(slug="bench", name="bench")
    install_python_tool(tenant=tenant, key="bench.echo", actor=None)
    agent = Agent.objects.create(tenant=tenant, slug="bench", name="bench")
    policy = {"limits": {"max_recursion": STEPS + 2, "model_calls": {"run_limit": None}}, "loop_detection": {"enabled": False}}
    version = AgentVersion.objects.create(tenant=tenant, agent=agent, number=1, model="demo/planner",
                                          system_prompt="You are a benchmark.", tools=["echo"], policy=policy)
    return World(tenant, agent, version)


def new_run(world: World, history_messages: int) -> Any:
    """A queued run whose session already holds ``history_messages`` messages (user + assistant turns)."""
    from agents.models import Run, RunStatus, Session, Turn

    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    earlier = Run.objects.bulk_create(
        Run(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input=f"earlier question {i}",
            output=f"earlier answer {i}: " + "lorem ipsum " * 8, status=RunStatus.FINISHED, terminal_reason="final_answer")
        for i in range(history_messages // 2)
    )
    Turn.objects.bulk_create(
        Turn(tenant=world.tenant, session=session, turn_seq=i + 1, run=r, user_message=r.input, assistant_message=r.output)
        for i, r in enumerate(earlier)
    )
    Session.objects.filter(pk=session.pk).update(turns=len(earlier))
    return Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session,
                              input="benchmark: call echo nine times, then answer")


def measure_run(world: World, history_messages: int) -> tuple[float, list[Slice]]:
    from django.db import connection

    from agents import model_clients, services
    from agents.models import Run
    from agents.store import DjangoRunStore
    from runtime.scripted import ScriptedModel, call, say

    run = new_run(world, history_messages)
    meter = Meter(connection)

    def step(reply: Any) -> Any:
        def reply_fn(request: Any) -> Any:
            meter.cut()
            return reply

        return reply_fn

    model = ScriptedModel([*(step(call("echo", {"n": i})) for i in range(STEPS - 1)), step(say("done"))])
    real_client, real_commit, real_step = model_clients.model_client_for, connection.commit, DjangoRunStore.commit_step
    model_clients.model_client_for = lambda run: model  # the only difference from a worker's path

    def counting_commit() -> None:
        real_commit()
        meter.committed()

    def timed_step(store: Any, run_id: str, record: Any) -> Any:
        started = time.perf_counter()
        try:
            return real_step(store, run_id, record)
        finally:
            meter.slices[-1].commit_seconds += time.perf_counter() - started

    from core.batch import WriteBatch

    real_execute, real_guarded = WriteBatch.execute, WriteBatch.execute_guarded

    def recorded_execute(batch: Any) -> None:
        # The step's writes leave as one "WITH … UPDATE" statement on PostgreSQL: its parts are sized per table.
        meter.writes.extend((meter.slices[-1], sql, params, False) for sql, params in batch._parts)
        real_execute(batch)

    def recorded_guarded(batch: Any, guard: str, params: list[Any]) -> Any:
        meter.writes.extend((meter.slices[-1], sql, params, False) for sql, params in batch._parts)
        return real_guarded(batch, guard, params)

    connection.commit = counting_commit
    DjangoRunStore.commit_step = timed_step  # type: ignore[method-assign]
    WriteBatch.execute = recorded_execute  # type: ignore[method-assign]
    WriteBatch.execute_guarded = recorded_guarded  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(meter):
            started = time.perf_counter()
            meter.started = started
            services.execute_run(str(run.pk))
            elapsed = time.perf_counter() - started
            meter.cut()
    finally:
        model_clients.model_client_for = real_client
        DjangoRunStore.commit_step = real_step  # type: ignore[method-assign]
        WriteBatch.execute = real_execute  # type: ignore[method-assign]
        WriteBatch.execute_guarded = real_guarded  # type: ignore[method-assign]
        del connection.commit
    meter.size_writes()
    done = Run.objects.get(pk=run.pk)
    if done.terminal_reason != "final_answer" or done.step != STEPS:
        raise SystemExit(f"the benchmark run did not finish as expected: {done.terminal_reason} at step {done.step}: {done.error}")
    # slices: [setup before the first model call, step 1, ..., step 10, after the run (empty)]
    return elapsed, meter.slices[1 : STEPS + 1] if meter.slices[-1].queries == 0 else meter.slices[1:]


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000, 3)


def summarise(history: int, runs: list[tuple[float, list[Slice]]]) -> dict[str, Any]:
    tool_steps = [s for _, slices in runs for s in slices[1 : STEPS - 1]]  # steps 2..9: one tool call each
    firsts = [slices[0] for _, slices in runs]
    lasts = [slices[STEPS - 1] for _, slices in runs]
    steady_tables: Counter[str] = Counter()
    for s in tool_steps:
        steady_tables.update(s.by_table)

    def per(slices: list[Slice], attr: str) -> float:
        return round(statistics.median(getattr(s, attr) for s in slices), 1)

    return {
        "history_messages": history,
        "runs": len(runs),
        "run_ms_median": _ms([e for e, _ in runs]),
        "run_ms_p95": _p95([e for e, _ in runs]),
        "step_ms_median": _ms([s.seconds for _, slices in runs for s in slices]),
        "tool_step_ms_median": _ms([s.seconds for s in tool_steps]),
        "tool_step_ms_p95": _p95([s.seconds for s in tool_steps]),
        "first_step_ms_median": _ms([s.seconds for s in firsts]),
        "final_step_ms_median": _ms([s.seconds for s in lasts]),
        "commit_ms_median": _ms([s.commit_seconds for _, slices in runs for s in slices]),
        "tool_step_commit_ms_median": _ms([s.commit_seconds for s in tool_steps]),
        "tool_step_commit_ms_p95": _p95([s.commit_seconds for s in tool_steps]),
        "queries": {"first_step": per(firsts, "queries"), "tool_step": per(tool_steps, "queries"), "final_step": per(lasts, "queries"),
                    "tool_step_min": min(s.queries for s in tool_steps), "tool_step_max": max(s.queries for s in tool_steps)},
        "transactions": {"first_step": per(firsts, "transactions"), "tool_step": per(tool_steps, "transactions"),
                         "final_step": per(lasts, "transactions")},
        "bytes_written": {"first_step": per(firsts, "written"), "tool_step": per(tool_steps, "written"),
                          "final_step": per(lasts, "written"),
                          "tool_step_by_table": {t: round(b / len(tool_steps)) for t, b in steady_tables.most_common()}},
    }


def print_table(results: list[dict[str, Any]]) -> None:
    columns = ["history msgs", "run ms (med / p95)", "step ms", "tool step ms", "commit ms (med / p95)",
               "queries/step (1st / tool / last)", "txn/step (1st / tool / last)", "bytes/step (1st / tool / last)"]
    rows = []
    for r in results:
        q, t, b = r["queries"], r["transactions"], r["bytes_written"]
        rows.append([
            str(r["history_messages"]),
            f"{r['run_ms_median']:.1f} / {r['run_ms_p95']:.1f}",
            f"{r['step_ms_median']:.2f}",
            f"{r['tool_step_ms_median']:.2f}",
            f"{r['tool_step_commit_ms_median']:.2f} / {r['tool_step_commit_ms_p95']:.2f}",
            f"{q['first_step']:g} / {q['tool_step']:g} / {q['final_step']:g}",
            f"{t['first_step']:g} / {t['tool_step']:g} / {t['final_step']:g}",
            f"{b['first_step']:g} / {b['tool_step']:g} / {b['final_step']:g}",
        ])
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]
    print(" | ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
    print()
    for r in results:
        print(f"history {r['history_messages']}: bytes per tool step by table: {r['bytes_written']['tool_step_by_table']}")


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def run_versus_peer(args: argparse.Namespace, url: str, server_version: str) -> None:
    """Ours and LangGraph + PostgresSaver (bench/step_peer_langgraph.py), interleaved round by round.

    Each round: ``--runs`` runs of ours, then ``--runs`` runs of the peer, same history, same server. A
    round's figure is its median step (ms, cut at each model call) and its median run; the table gives
    min / median / max of those over the rounds, and ours / peer of the medians.
    """
    import warnings

    warnings.filterwarnings("ignore", message=".*create_react_agent.*")
    from bench.step_peer_langgraph import Peer, peer_url
    from bench.step_peer_langgraph import drop_database as drop_peer
    from bench.step_peer_langgraph import recreate_database as recreate_peer

    history = int(args.history.split(",")[0])
    purl = peer_url()
    recreate_peer(purl)
    try:
        setup_django(url)
        from django.conf import settings
        from django.db import connection

        world = make_world()
        peer = Peer(purl, history)
        for _ in range(args.warmup):
            measure_run(world, history)
            peer.measure_run()
        rounds: list[dict[str, Any]] = []
        for number in range(1, args.rounds + 1):
            ours = [measure_run(world, history) for _ in range(args.runs)]
            theirs = [peer.measure_run() for _ in range(args.runs)]
            r = {
                "round": number,
                "ours_step_ms": _ms([s.seconds for _, slices in ours for s in slices]),
                "ours_run_ms": _ms([e for e, _ in ours]),
                "ours_tool_step_commit_ms": _ms([s.commit_seconds for _, slices in ours for s in slices[1 : STEPS - 1]]),
                "peer_step_ms": _ms([s for _, steps in theirs for s in steps]),
                "peer_run_ms": _ms([e for e, _ in theirs]),
            }
            r["ratio_step"] = round(r["ours_step_ms"] / r["peer_step_ms"], 3)  # same moment, same load: the fairest pairing
            r["ratio_run"] = round(r["ours_run_ms"] / r["peer_run_ms"], 3)
            rounds.append(r)
            print(f"round {number}: ours step {r['ours_step_ms']:.2f} ms (run {r['ours_run_ms']:.1f}), "
                  f"peer step {r['peer_step_ms']:.2f} ms (run {r['peer_run_ms']:.1f}), ours/peer {r['ratio_step']:.2f}x", flush=True)
        peer.close()
        layer = "redis" if settings.REDIS_URL else "in-memory"
        summary = {key: _spread([r[key] for r in rounds])
                   for key in ("ours_step_ms", "peer_step_ms", "ours_run_ms", "peer_run_ms", "ratio_step", "ratio_run")}
        step_ratio = summary["ours_step_ms"]["median"] / summary["peer_step_ms"]["median"]
        run_ratio = summary["ours_run_ms"]["median"] / summary["peer_run_ms"]["median"]
        print(f"\nours vs LangGraph {_version('langgraph')} + PostgresSaver {_version('langgraph-checkpoint-postgres')} "
              f"(durability=sync): {STEPS}-step run, history {history}, {args.rounds} interleaved rounds of {args.runs} runs, "
              f"PostgreSQL {server_version}, our channel layer {layer}\n")
        print(f"{'':34} | {'min':>8} | {'median':>8} | {'max':>8}")
        print("-" * 35 + "+" + "-" * 10 + "+" + "-" * 10 + "+" + "-" * 9)
        for label, key in (("ours: step ms", "ours_step_ms"), ("LangGraph + PostgresSaver: step ms", "peer_step_ms"),
                           ("ours: run ms", "ours_run_ms"), ("LangGraph + PostgresSaver: run ms", "peer_run_ms")):
            v = summary[key]
            print(f"{label:34} | {v['min']:8.2f} | {v['median']:8.2f} | {v['max']:8.2f}")
        for label, key in (("ours / peer per round: step", "ratio_step"), ("ours / peer per round: run", "ratio_run")):
            v = summary[key]
            print(f"{label:34} | {v['min']:8.2f} | {v['median']:8.2f} | {v['max']:8.2f}")
        print(f"\nours / peer (medians): step {step_ratio:.2f}x, run {run_ratio:.2f}x")
        out = Path(args.out if args.out != DEFAULT_OUT else str(ROOT / "bench" / "results" / "step_vs_peer.json"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "benchmark": "step_vs_peer", "steps_per_run": STEPS, "history_messages": history, "rounds": args.rounds,
            "runs_per_round": args.runs, "database": f"PostgreSQL {server_version}", "channel_layer": layer,
            "peer": {"langgraph": _version("langgraph"), "langgraph-checkpoint-postgres": _version("langgraph-checkpoint-postgres"),
                     "langchain-core": _version("langchain-core"), "durability": "sync"},
            "python": platform.python_version(), "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "summary": summary, "ratio_step": round(step_ratio, 3), "ratio_run": round(run_ratio, 3), "per_round": rounds,
        }, indent=2) + "\n")
        print(f"written {out}")
        connection.close()
    finally:
        if not args.keep_db:
            drop_peer(purl)


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


DEFAULT_OUT = str(ROOT / "bench" / "results" / "step_overhead.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=None,
                        help="Measured runs per history length (default 30), or per round and side with --peer (default 10).")
    parser.add_argument("--peer", action="store_true",
                        help="Interleave rounds of ours and of LangGraph + PostgresSaver (needs requirements-bench.txt).")
    parser.add_argument("--rounds", type=int, default=5, help="With --peer: interleaved rounds (at least 3, default 5).")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--history", default="10,100", help="History lengths in messages (default 10,100).")
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--keep-db", action="store_true", help="Do not drop the benchmark database afterwards.")
    args = parser.parse_args()
    if args.runs is None:
        args.runs = 10 if args.peer else 30
    if args.peer and args.rounds < 3:
        parser.error("--rounds must be at least 3")

    url = bench_url()
    server_version = recreate_database(url)
    if args.peer:
        try:
            run_versus_peer(args, url, server_version)
        finally:
            if not args.keep_db:
                drop_database(url)
        return
    try:
        setup_django(url)
        from django.conf import settings
        from django.db import connection

        world = make_world()
        results = []
        for history in (int(h) for h in args.history.split(",")):
            for _ in range(args.warmup):
                measure_run(world, history)
            results.append(summarise(history, [measure_run(world, history) for _ in range(args.runs)]))
        print(f"step overhead: {STEPS}-step run (9 tool steps + answer), zero-latency scripted model, "
              f"PostgreSQL {server_version}, channel layer {'redis' if settings.REDIS_URL else 'in-memory'}\n")
        print_table(results)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "benchmark": "step_overhead",
            "steps_per_run": STEPS,
            "database": f"PostgreSQL {server_version}",
            "channel_layer": "redis" if settings.REDIS_URL else "in-memory",
            "python": platform.python_version(),
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "notes": "tool step = steps 2-9 (one echo call + one commit each); first step also persists the assembled "
                     "context (history); final step closes the session turn. Times include the live publish.",
            "results": results,
        }
        out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"\nwritten {out}")
        connection.close()
    finally:
        if not args.keep_db:
            drop_database(url)


if __name__ == "__main__":
    main()
