"""What the tool gateway itself costs per call, and what a call's audit write costs, on PostgreSQL.

A trivial Python tool (``bench.noop``, returns ``{"ok": True}``) is called N times (2,000 by
default) in each of these ways, one call at a time, and each call is timed:

- *direct*: the function itself, ``noop()``;
- *python executor*: ``tools.kinds.python.execute`` (the registry lookup and argument conversion
  the gateway's executor does, without the gateway);
- *gateway, in-process*: ``ToolGateway.execute`` with no approval gate and no tool policy: only
  the in-process stages (resolve, authorize, validate, execute on the tool pool, shape, build
  the audit row);
- *gateway, production*: ``ToolGateway.execute`` wired as ``agents.engine.build_loop`` wires it
  (the marketplace tool policy and the approval gate, one query each) — what a read call costs
  a worker;
- *gateway, production, write tool*: the same for a ``write`` tool (``bench.noop_write``): the
  duplicate guard's query and the ``started`` audit row committed before the call;
- *reference*: one ``SELECT 1`` round trip, to read the query counts against.

The audit rows the gateway buffers are not written in those loops: the step's commit writes
them. That cost is measured separately: ``audit.chain.write_sealed`` for a batch of 1 and of 10
rows (the step's transaction, excluding and including its commit).

    make bench-gateway               # or: .venv/bin/python bench/gateway_overhead.py [--calls 2000]

The database is created from scratch (and dropped afterwards unless ``--keep-db``):
``BENCH_DATABASE_URL``, else ``DATABASE_URL``'s server with the database
``agentops_bench_gateway``, else ``postgres://postgres@127.0.0.1:5432/agentops_bench_gateway``.
Results: a table on stdout and ``bench/results/gateway_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from step_overhead import ROOT, bench_url, drop_database, recreate_database, setup_django

BENCH_DB = "agentops_bench_gateway"
#: Calls in the separate pass that counts statements and the time spent in them (kept out of the timed pass).
SHARE_CALLS = 200


def noop() -> dict[str, Any]:
    """Do nothing and say so (a trivial tool for the benchmark)."""
    return {"ok": True}


def noop_write() -> dict[str, Any]:
    """Do nothing, as a write (a trivial side-effecting tool for the benchmark)."""
    return {"ok": True}


def register_tools() -> None:
    from tools.pyfunc import registry, tool

    if "bench.noop" not in registry:
        tool(key="bench.noop", category="read")(noop)
        tool(key="bench.noop_write", name="noop_write", category="write", idempotent=True)(noop_write)


# -- the world ------------------------------------------------------------------------------------


@dataclass
class World:
    tenant: Any
    run: Any
    tools: list[Any]


def make_world() -> World:
    from agents.models import Agent, AgentVersion, Run, RunStatus, Session
    from tenants.models import Tenant
    from tools.services import install_python_tool

    tenant = Tenant.objects.create(slug="bench-gateway", name="bench gateway")
    tools = [install_python_tool(tenant=tenant, key=k, actor=None) for k in ("bench.noop", "bench.noop_write")]
    agent = Agent.objects.create(tenant=tenant, slug="bench", name="bench")
    version = AgentVersion.objects.create(tenant=tenant, agent=agent, number=1, model="demo/planner",
                                          system_prompt="You are a benchmark.", tools=[t.name for t in tools])
    session = Session.objects.create(tenant=tenant, agent=agent)
    run = Run.objects.create(tenant=tenant, agent=agent, version=version, session=session, input="benchmark",
                             status=RunStatus.RUNNING)
    run = Run.objects.select_related("tenant", "session", "version").get(pk=run.pk)
    return World(tenant, run, tools)


def gateway(world: World, *, production: bool, buffer: Any) -> Any:
    """A ToolGateway for the run; ``production``: wired as ``agents.engine.build_loop`` wires it."""
    from agents.engine import approval_overrides, session_grants
    from approvals.gate import ApprovalGate
    from marketplace.access import tool_allowed_for
    from tools.gateway import ToolGateway

    if not production:
        return ToolGateway(run=world.run, tools=world.tools, audit=buffer)
    return ToolGateway(run=world.run, tools=world.tools, audit=buffer, grants=session_grants(world.run),
                       approvals=ApprovalGate(world.run, overrides=approval_overrides(world.run)), tool_policy=tool_allowed_for)


# -- measuring ------------------------------------------------------------------------------------


def timed(calls: int, warmup: int, one: Callable[[int], Any]) -> list[float]:
    """Seconds per call of ``one(i)``, after ``warmup`` untimed calls."""
    for i in range(warmup):
        one(-1 - i)
    samples = []
    for i in range(calls):
        started = time.perf_counter_ns()
        one(i)
        samples.append((time.perf_counter_ns() - started) / 1e9)
    return samples


def database_share(one: Callable[[int], Any], calls: int = SHARE_CALLS) -> tuple[float, float]:
    """Statements per call, and the median time per call spent executing them (sent to the result read)."""
    from django.db import connection

    count = 0
    spent = 0

    def meter(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal count, spent
        count += 1
        started = time.perf_counter_ns()
        try:
            return execute(sql, params, many, context)
        finally:
            spent += time.perf_counter_ns() - started

    per_call = []
    with connection.execute_wrapper(meter):
        for i in range(calls):
            spent = 0
            one(10_000_000 + i)
            per_call.append(spent / 1e9)
    return count / calls, statistics.median(per_call)


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def summary(name: str, samples: list[float], share: tuple[float, float], per: int = 1) -> dict[str, Any]:
    queries, in_database = share
    return {
        "name": name,
        "samples": len(samples),
        "median_us": _us(statistics.median(samples)),
        "p95_us": _us(_p95(samples)),
        "mean_us": _us(statistics.fmean(samples)),
        "queries": queries,
        "in_database_us_median": _us(in_database),
        "rows_per_sample": per,
        "median_us_per_row": _us(statistics.median(samples) / per),
    }


def measure_calls(world: World, calls: int, warmup: int) -> list[dict[str, Any]]:
    from django.db import connection

    from runtime.types import ToolCall, ToolContext, ToolStatus
    from tools.executors import ExecContext
    from tools.kinds.python import execute as run_python

    noop_tool = next(t for t in world.tools if t.name == "noop")
    exec_ctx = ExecContext(tenant_id=world.tenant.pk, run=world.run, step=1, call_id="c", span_id="s")

    def direct(i: int) -> Any:
        return noop()

    def executor(i: int) -> Any:
        return run_python(noop_tool, {}, exec_ctx)

    def round_trip(i: int) -> Any:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone()

    def through(production: bool, name: str) -> Callable[[int], Any]:
        from audit.unit_of_work import StepAudit

        buffer = StepAudit()
        gw = gateway(world, production=production, buffer=buffer)
        run_id = str(world.run.pk)

        def one(i: int) -> Any:
            # a new step and call id per call, as in a run (the approval gate and the write's key look them up)
            outcome = gw.execute(ToolCall(f"call_{i}", name, "{}"), ToolContext(run_id=run_id, step=i + 1_000_000, span_id="s"))
            if outcome.status != ToolStatus.OK:
                raise SystemExit(f"the benchmark call failed: {outcome.status}: {outcome.content}")
            buffer.discard()  # the step's commit would write them; measured separately
            return outcome

        return one

    paths = [
        ("direct function call", direct),
        ("python executor (run_python)", executor),
        ("gateway, in-process stages only", through(False, "noop")),
        ("gateway, production wiring (read)", through(True, "noop")),
        ("gateway, production wiring (write)", through(True, "noop_write")),
        ("reference: one query round trip (SELECT 1)", round_trip),
    ]
    return [summary(name, timed(calls, warmup, one), database_share(one)) for name, one in paths]


def measure_audit(world: World, batches: int, warmup: int) -> list[dict[str, Any]]:
    from audit.unit_of_work import StepAudit
    from runtime.types import ToolCall, ToolContext

    rows = StepAudit()
    gw = gateway(world, production=False, buffer=rows)

    def audit_rows(n: int) -> list[Any]:
        rows.discard()
        for _ in range(n):
            gw.execute(ToolCall("call_a", "noop", "{}"), ToolContext(run_id=str(world.run.pk), step=1, span_id="s"))
        return list(rows)

    results = []
    for size in (1, 10):
        results.extend(measure_audit_batches(world, size, [audit_rows(size) for _ in range(2 * (batches + warmup + SHARE_CALLS))],
                                             batches, warmup))
    return results


def measure_audit_batches(world: World, size: int, pending: list[list[Any]], batches: int, warmup: int) -> list[dict[str, Any]]:
    """``write_sealed`` for batches of ``size`` rows: inside the step's transaction, and as a transaction of its own."""
    from django.db import transaction

    from audit.chain import write_sealed

    spent: list[float] = []

    def in_transaction(i: int) -> Any:
        # the step's transaction: the sealed writes' statements, not the commit (which the step pays anyway)
        with transaction.atomic():
            started = time.perf_counter_ns()
            write_sealed(pending.pop(), world.tenant.pk)
            spent.append((time.perf_counter_ns() - started) / 1e9)

    def with_commit(i: int) -> Any:
        with transaction.atomic():
            write_sealed(pending.pop(), world.tenant.pk)

    share = database_share(in_transaction)
    spent.clear()
    timed(batches, warmup, in_transaction)
    inside = summary(f"write_sealed, batch of {size}, in the step's transaction", spent[warmup:], share, size)
    own = summary(f"write_sealed, batch of {size}, own transaction incl. commit", timed(batches, warmup, with_commit),
                  database_share(with_commit), size)
    return [inside, own]


def print_table(calls: list[dict[str, Any]], audit: list[dict[str, Any]]) -> None:
    direct = calls[0]["median_us"]
    columns = ["path", "median µs", "p95 µs", "overhead vs direct (median µs)", "queries/call", "in the database (median µs)"]
    rows = [[c["name"], f"{c['median_us']:.1f}", f"{c['p95_us']:.1f}", "—" if i == 0 else f"{c['median_us'] - direct:.1f}",
             f"{c['queries']:g}", f"{c['in_database_us_median']:.1f}"] for i, c in enumerate(calls)]
    columns_a = ["audit write", "median µs / batch", "p95 µs / batch", "median µs / row", "queries/batch", "in the database (median µs)"]
    rows_a = [[a["name"], f"{a['median_us']:.1f}", f"{a['p95_us']:.1f}", f"{a['median_us_per_row']:.1f}", f"{a['queries']:g}",
               f"{a['in_database_us_median']:.1f}"] for a in audit]
    for header, body in ((columns, rows), (columns_a, rows_a)):
        widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
        print(" | ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))))
        print("-+-".join("-" * w for w in widths))
        for r in body:
            print(" | ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))))
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=2000, help="Timed calls (and audit batches) per path (default 2000).")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gateway_overhead.json"))
    parser.add_argument("--keep-db", action="store_true", help="Do not drop the benchmark database afterwards.")
    args = parser.parse_args()

    url = bench_url(BENCH_DB)
    server_version = recreate_database(url)
    try:
        setup_django(url)
        from django.db import connection

        register_tools()
        world = make_world()
        calls = measure_calls(world, args.calls, args.warmup)
        audit = measure_audit(world, args.calls, args.warmup)
        print(f"tool gateway overhead: trivial Python tool, {args.calls} calls per path after {args.warmup} warm-up, "
              f"PostgreSQL {server_version}\n")
        print_table(calls, audit)
        by_name = {c["name"]: c for c in calls}
        direct = by_name["direct function call"]["median_us"]
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "benchmark": "gateway_overhead",
            "calls_per_path": args.calls,
            "warmup": args.warmup,
            "database": f"PostgreSQL {server_version}",
            "python": platform.python_version(),
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "notes": "Per call, one call at a time. Gateway paths exclude the audit write (the step's commit writes the "
                     "buffered rows); the audit rows measure write_sealed separately, per batch and per row.",
            "overhead_us_median": {
                "gateway_in_process": round(by_name["gateway, in-process stages only"]["median_us"] - direct, 1),
                "gateway_production_read": round(by_name["gateway, production wiring (read)"]["median_us"] - direct, 1),
                "gateway_production_write": round(by_name["gateway, production wiring (write)"]["median_us"] - direct, 1),
            },
            "calls": calls,
            "audit": audit,
        }
        out.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        print(f"written {out}")
        connection.close()
    finally:
        if not args.keep_db:
            drop_database(url)


if __name__ == "__main__":
    main()
