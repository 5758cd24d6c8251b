"""Scheduling overhead per node of a flow run (issue #15), beside the same graph in LangGraph + PostgresSaver.

The graph: 20 nodes, ``start`` -> 10 parallel nodes ``p0..p9`` -> ``join`` -> a chain ``c1..c7`` -> ``end``. Every node
is a tool node calling ``bench.echo``, a Python tool that returns at once, so what is timed is scheduling and
persistence: the run's lease, ``flows.runner.advance`` deciding the next nodes under the run's row lock, each node's
row, its trace events, its tool audit row and its completion committed in one transaction.

Ours is measured two ways:

(a) **in-process**: ``services.execute_run`` and then ``flows.runner.execute_node`` for every started node, called
    here as an eager worker would (the node tasks' enqueue is replaced by a local queue). No broker, no worker
    process: the pure cost of our durability. This is the like-for-like pairing with LangGraph, which runs in
    the caller's process too.
(b) **worker**: a real Celery worker process (threads, on Redis) runs ``agents.execute_run`` and every
    ``flows.execute_node`` task; this process enqueues the run and waits for ``finished_at``. End to end,
    queueing and the worker's pick-up included.

(c) **inline**: the same graph with ``"inline": true`` (README "Flows"): the nodes run in the task that started them,
    a wave at a time, each wave's completions and the next decision committed in one transaction; in-process as (a).
(d) **routing nodes, inline**: the same graph and run as (c), but its first 19 nodes are ``switch`` nodes (a JMESPath
    condition each, choosing the nodes after it) and only ``end`` calls the tool: scheduling and persistence (node
    rows, trace events, one transaction per wave) without a tool call's gateway, audit row and call events at every
    node. The peer's nodes call nothing either: this is the like-for-like figure for "scheduling overhead per node".

The peer: a LangGraph ``StateGraph`` of the same shape (the 10 nodes as parallel branches joined by one edge from
all of them), ``PostgresSaver`` checkpointer, ``durability="sync"``, same PostgreSQL server, its own database.

Rounds are interleaved: each round runs ``--runs`` flows of (a), of the peer, then of (b). A round's figure is its
median run divided by 20 nodes; the table gives min / median / max over the rounds and ours / LangGraph.
(a) also counts SQL statements and transactions (commits plus autocommitted writes) per node.

    make bench-flow                 # or: .venv/bin/python bench/flow_overhead.py [--rounds 5 --runs 10] [--no-worker]

Databases ``agentops_bench_flow`` and ``agentops_bench_flow_peer`` on ``BENCH_DATABASE_URL``'s / ``DATABASE_URL``'s
server (else ``postgres://postgres@127.0.0.1:5432``), created and dropped here (``--keep-db`` keeps them).
``REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) is the broker and channel layer; the worker consumes a queue
of its own. Results: stdout and ``bench/results/flow_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Annotated, Any, TypedDict
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.step_overhead import _version, bench_url, drop_database, recreate_database  # noqa: E402

FAN = 10
CHAIN = 7
NODES = 1 + FAN + 1 + CHAIN + 1  # start, p0..p9, join, c1..c7, end
BENCH_DB = "agentops_bench_flow"
#: Seconds each node's tool takes (``--tool-ms``; the worker of (b) reads it from the environment).
PAUSE = float(os.environ.get("BENCH_FLOW_TOOL_MS", "0") or 0) / 1000
PEER_DB = "agentops_bench_flow_peer"


def node_ids() -> list[tuple[str, list[str]]]:
    """(node, its dependencies) for the 20-node graph."""
    fan = [f"p{i}" for i in range(FAN)]
    chain = [f"c{i}" for i in range(1, CHAIN + 1)]
    out: list[tuple[str, list[str]]] = [("start", [])]
    out += [(p, ["start"]) for p in fan]
    out.append(("join", fan))
    previous = "join"
    for c in [*chain, "end"]:
        out.append((c, [previous]))
        previous = c
    assert len(out) == NODES
    return out


def definition() -> dict[str, Any]:
    nodes = [{"id": nid, "kind": "tool", "tool": "echo", "values": {"n": i}, **({"after": deps} if deps else {})}
             for i, (nid, deps) in enumerate(node_ids())]
    return {"max_parallel": FAN, "nodes": nodes, "output": "nodes.end"}


def routing_definition() -> dict[str, Any]:
    """(d): the graph of :func:`definition`, its nodes ``switch`` nodes that choose their successors (a condition that
    is never true, and the successors as the default), the last one the echo tool node."""
    after: dict[str, list[str]] = {}
    for nid, deps in node_ids():
        for dep in deps:
            after.setdefault(dep, []).append(nid)
    nodes: list[dict[str, Any]] = []
    for i, (nid, deps) in enumerate(node_ids()):
        if nid in after:
            node: dict[str, Any] = {"id": nid, "kind": "switch", "cases": [{"when": "`false`", "goto": after[nid][:1]}],
                                    "default": after[nid]}
        else:
            node = {"id": nid, "kind": "tool", "tool": "echo", "values": {"n": i}}
        nodes.append({**node, **({"after": deps} if deps else {})})
    return {"max_parallel": FAN, "nodes": nodes, "output": "nodes.end", "inline": True}


def register_echo() -> None:
    """The nodes' tool, in this process and in the worker's (``bench/flow_worker.py``)."""
    from tools.pyfunc import registry, tool

    if "bench.echo" not in registry:

        @tool(key="bench.echo", category="read")
        def echo(n: int) -> dict[str, Any]:
            """Return the number it is given (a trivial tool for the benchmark)."""
            if PAUSE:
                time.sleep(PAUSE)
            return {"n": n}


def setup_django(url: str, queue: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    os.environ["AGENTOPS_QUEUE"] = queue
    os.environ["TENANT_MAX_RUNNING"] = str(FAN)  # the default bound (3) would hold seven of the ten back
    os.environ.setdefault("DEBUG", "false")
    os.environ.setdefault("HTTPS_ONLY", "false")
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-0123456789abcdefghijklmnop")
    os.environ.setdefault("AGENTOPS_VAR_DIR", tempfile.mkdtemp(prefix="agentops-bench-flow-"))
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def make_flow() -> tuple[Any, Any, Any]:
    """The tenant, the echo tool, the flow (a task per node), the same flow with ``inline: true`` and the routing flow
    of (d), each with its version (its definition checked as at save)."""
    from agents.models import Agent, AgentKind, AgentVersion
    from runtime.flows import FlowDefinition
    from tenants.models import Tenant
    from tools.services import install_python_tool

    register_echo()
    tenant = Tenant.objects.create(slug="bench", name="bench")
    install_python_tool(tenant=tenant, key="bench.echo", actor=None)
    versions = []
    docs = {"bench-flow": {**definition(), "inline": False}, "bench-flow-inline": {**definition(), "inline": True},
            "bench-flow-route": routing_definition()}
    for slug, doc in docs.items():
        agent = Agent.objects.create(tenant=tenant, slug=slug, name=slug, kind=AgentKind.FLOW)
        FlowDefinition.model_validate(doc)
        version = AgentVersion.objects.create(tenant=tenant, agent=agent, number=1, model="demo/planner", definition=doc)
        Agent.objects.filter(pk=agent.pk).update(current_version=version)
        versions.append(version)
    return versions[0], versions[1], versions[2]


def new_run(version: Any) -> Any:
    from agents.models import Run, Session

    session = Session.objects.create(tenant=version.tenant, agent=version.agent)
    return Run.objects.create(tenant=version.tenant, agent=version.agent, version=version, session=session,
                              input=json.dumps({"order_id": "bench"}))


def check(run_id: Any) -> None:
    from agents.models import Run
    from flows.models import FlowNodeRun

    run = Run.objects.get(pk=run_id)
    done = FlowNodeRun.objects.filter(run_id=run_id, status="done", attempt=1).count()
    if run.terminal_reason != "final_answer" or done != NODES:
        raise SystemExit(f"the flow run did not finish as expected: {run.terminal_reason} {run.error!r}, {done} nodes done")


class Counter:
    """SQL statements and transactions (commits + autocommitted writes; a guarded wave's ``WITH g AS …`` is sent in
    ``transaction.atomic()`` and counted by its commit) on this process's connection."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.queries = 0
        self.transactions = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.queries += 1
        if sql.lstrip()[:6].upper() in ("INSERT", "UPDATE", "DELETE", "WITH G") and self.connection.get_autocommit():
            self.transactions += 1
        return execute(sql, params, many, context)


def run_in_process(version: Any) -> tuple[float, int, int]:
    """(seconds, statements, transactions) of one flow run driven here: execute_run, then every started node."""
    from django.db import connection

    from agents import services
    from flows import runner

    run = new_run(version)
    queue: deque[tuple[str, str, str]] = deque()
    real_enqueue, real_commit = runner._enqueue, connection.commit
    runner._enqueue = lambda run_id, started: queue.extend((run_id, n, t) for n, t in started)  # type: ignore[assignment]
    counter = Counter(connection)

    def counting_commit() -> None:
        real_commit()
        counter.transactions += 1

    connection.commit = counting_commit
    try:
        with connection.execute_wrapper(counter):
            began = time.perf_counter()
            services.execute_run(str(run.pk))
            while queue:
                runner.execute_node(*queue.popleft())
            elapsed = time.perf_counter() - began
    finally:
        runner._enqueue = real_enqueue  # type: ignore[assignment]
        del connection.commit
    check(run.pk)
    return elapsed, counter.queries, counter.transactions


def run_on_worker(version: Any, timeout: float = 60.0) -> float:
    """Seconds from enqueueing the run to its committed ``finished_at``, a real worker running every task."""
    import datetime as dt

    from agents.models import Run
    from agents.tasks import execute_run_task

    run = new_run(version)
    sent = dt.datetime.now(dt.UTC)
    execute_run_task.delay(str(run.pk))
    deadline = time.monotonic() + timeout
    while True:
        finished = Run.objects.filter(pk=run.pk).values_list("finished_at", flat=True).first()
        if finished is not None:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"the worker did not finish flow run {run.pk} in {timeout:g}s")
        time.sleep(0.01)
    check(run.pk)
    return (finished - sent).total_seconds()


class Worker:
    """One Celery worker process (threads, ``--concurrency``) on this benchmark's database and queue; stopped by PID."""

    def __init__(self, url: str, queue: str, concurrency: int) -> None:
        env = dict(os.environ)
        env.update(DATABASE_URL=url, AGENTOPS_QUEUE=queue)
        self.log = Path(tempfile.mkstemp(prefix="agentops-bench-flow-worker-", suffix=".log")[1])
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "flow_worker.py"), "worker", "--pool=threads", f"--concurrency={concurrency}",
             "-Q", queue, "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=WARNING",
             "-n", f"{queue}@%h"], cwd=ROOT, env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Peer:
    """The same 20-node graph as a LangGraph StateGraph on PostgresSaver (durability=sync)."""

    def __init__(self, url: str) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph
        from psycopg import Connection
        from psycopg.rows import dict_row

        def echo_node(n: int) -> Any:
            def node(state: State) -> dict[str, Any]:
                if PAUSE:
                    time.sleep(PAUSE)
                return {"done": [{"n": n}]}  # the echo tool's answer
            return node

        graph = StateGraph(State)
        for i, (nid, _) in enumerate(node_ids()):
            graph.add_node(nid, echo_node(i))
        graph.add_edge(START, "start")
        for nid, deps in node_ids():
            if len(deps) == 1:
                graph.add_edge(deps[0], nid)
            elif deps:
                graph.add_edge(deps, nid)  # the join waits for all ten branches
        graph.add_edge("end", END)
        self.conn = Connection.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        self.saver = PostgresSaver(self.conn)
        self.saver.setup()
        self.graph = graph.compile(checkpointer=self.saver)

    def measure_run(self) -> float:
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        began = time.perf_counter()
        out = self.graph.invoke({"done": []}, config, durability="sync")
        elapsed = time.perf_counter() - began
        if len(out["done"]) != NODES:
            raise SystemExit(f"the peer run did not finish as expected: {len(out['done'])} nodes")
        return elapsed

    def close(self) -> None:
        self.conn.close()


class State(TypedDict):
    """The peer's state: each node's answer, appended (the ten branches' writes are merged by ``operator.add``)."""

    done: Annotated[list[dict[str, Any]], operator.add]


def peer_url(url: str) -> str:
    if os.environ.get("BENCH_PEER_DATABASE_URL"):
        return os.environ["BENCH_PEER_DATABASE_URL"]
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, f"/{PEER_DB}", "", ""))


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def _per_node_ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000 / NODES, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (3 to 5 is plenty; at least 3)")
    parser.add_argument("--runs", type=int, default=10, help="flow runs per round and side")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=10, help="the worker's threads for (b) (default 10: the fan-out)")
    parser.add_argument("--no-worker", action="store_true", help="skip (b), the real Celery worker")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "flow_overhead.json"))
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--tool-ms", type=float, default=0.0,
                        help="milliseconds each node's tool takes, ours and the peer's alike (default 0: pure overhead; "
                             "e.g. 50 shows what running a wave's branches side by side buys)")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")
    global PAUSE
    PAUSE = max(0.0, args.tool_ms) / 1000
    os.environ["BENCH_FLOW_TOOL_MS"] = str(args.tool_ms)  # the worker process of (b) registers the same tool

    url = bench_url(BENCH_DB)
    purl = peer_url(url)
    server_version = recreate_database(url)
    recreate_database(purl)
    queue = f"agentops-bench-flow-{os.getpid()}"
    worker: Worker | None = None
    try:
        setup_django(url, queue)
        from django.db import connection

        version, inline, route = make_flow()
        peer = Peer(purl)
        if not args.no_worker:
            worker = Worker(url, queue, args.concurrency)
        for _ in range(args.warmup):
            run_in_process(version)
            run_in_process(inline)
            run_in_process(route)
            peer.measure_run()
        if worker is not None:
            for _ in range(args.warmup):
                run_on_worker(version)  # also waits for the worker to be up
        rounds: list[dict[str, Any]] = []
        counts: list[tuple[int, int]] = []
        inline_counts: list[tuple[int, int]] = []
        route_counts: list[tuple[int, int]] = []
        for number in range(1, args.rounds + 1):
            ours = [run_in_process(version) for _ in range(args.runs)]
            ours_inline = [run_in_process(inline) for _ in range(args.runs)]
            ours_route = [run_in_process(route) for _ in range(args.runs)]
            theirs = [peer.measure_run() for _ in range(args.runs)]
            counts += [(q, t) for _, q, t in ours]
            inline_counts += [(q, t) for _, q, t in ours_inline]
            route_counts += [(q, t) for _, q, t in ours_route]
            r: dict[str, Any] = {"round": number, "ours_inprocess_node_ms": _per_node_ms([e for e, _, _ in ours]),
                                 "ours_inline_node_ms": _per_node_ms([e for e, _, _ in ours_inline]),
                                 "ours_route_node_ms": _per_node_ms([e for e, _, _ in ours_route]),
                                 "peer_node_ms": _per_node_ms(theirs)}
            r["ratio_inline"] = round(r["ours_inline_node_ms"] / r["peer_node_ms"], 3)
            r["ratio_route"] = round(r["ours_route_node_ms"] / r["peer_node_ms"], 3)
            if worker is not None:
                r["ours_worker_node_ms"] = _per_node_ms([run_on_worker(version) for _ in range(args.runs)])
                r["ratio_worker"] = round(r["ours_worker_node_ms"] / r["peer_node_ms"], 3)
            r["ratio_inprocess"] = round(r["ours_inprocess_node_ms"] / r["peer_node_ms"], 3)
            rounds.append(r)
            print(f"round {number}: per node ms: ours in-process {r['ours_inprocess_node_ms']:.2f}, inline "
                  f"{r['ours_inline_node_ms']:.2f}, routing nodes inline {r['ours_route_node_ms']:.2f}, LangGraph "
                  f"{r['peer_node_ms']:.2f}" + (f", ours on a worker {r['ours_worker_node_ms']:.2f}" if worker else "")
                  + f"; in-process / LangGraph {r['ratio_inprocess']:.2f}x", flush=True)
        peer.close()
        keys = ["ours_inprocess_node_ms", "ours_inline_node_ms", "ours_route_node_ms", "peer_node_ms", "ratio_inprocess",
                "ratio_inline", "ratio_route"]
        if worker is not None:
            keys += ["ours_worker_node_ms", "ratio_worker"]
        summary = {k: _spread([r[k] for r in rounds]) for k in keys}
        queries = statistics.median(q for q, _ in counts) / NODES
        transactions = statistics.median(t for _, t in counts) / NODES
        print(f"\n{NODES}-node flow (start -> {FAN} parallel -> join -> {CHAIN} chained -> end, echo tool nodes"
              + (f" of {args.tool_ms:g} ms each" if args.tool_ms else "") + "), "
              f"{args.rounds} interleaved rounds of {args.runs} runs, PostgreSQL {server_version}; LangGraph "
              f"{_version('langgraph')} + PostgresSaver {_version('langgraph-checkpoint-postgres')} (durability=sync)\n")
        print(f"{'ms per node':42} | {'min':>7} | {'median':>7} | {'max':>7}")
        print("-" * 43 + "+" + "-" * 9 + "+" + "-" * 9 + "+" + "-" * 8)
        labels = {"ours_inprocess_node_ms": "ours (a) in-process", "peer_node_ms": "LangGraph + PostgresSaver",
                  "ours_inline_node_ms": "ours (c) in-process, inline: true", "ratio_inline": "(c) / LangGraph per round",
                  "ours_route_node_ms": "ours (d) routing nodes, inline", "ratio_route": "(d) / LangGraph per round",
                  "ours_worker_node_ms": "ours (b) Celery worker on Redis",
                  "ratio_inprocess": "(a) / LangGraph per round", "ratio_worker": "(b) / LangGraph per round"}
        for k in keys:
            v = summary[k]
            print(f"{labels[k]:42} | {v['min']:7.2f} | {v['median']:7.2f} | {v['max']:7.2f}")
        ratio_a = summary["ours_inprocess_node_ms"]["median"] / summary["peer_node_ms"]["median"]
        print(f"\nours (a) / LangGraph (medians): {ratio_a:.2f}x"
              + (f"; ours (b) / LangGraph: {summary['ours_worker_node_ms']['median'] / summary['peer_node_ms']['median']:.2f}x"
                 if worker else ""))
        print(f"(a) per node: {queries:.1f} SQL statements, {transactions:.2f} transactions "
              f"(run medians {statistics.median(q for q, _ in counts):g} / {statistics.median(t for _, t in counts):g})")
        iq = statistics.median(q for q, _ in inline_counts)
        it = statistics.median(t for _, t in inline_counts)
        print(f"(c) per node: {iq / NODES:.1f} SQL statements, {it / NODES:.2f} transactions (run medians {iq:g} / {it:g})")
        rq = statistics.median(q for q, _ in route_counts)
        rt = statistics.median(t for _, t in route_counts)
        print(f"(d) per node: {rq / NODES:.1f} SQL statements, {rt / NODES:.2f} transactions (run medians {rq:g} / {rt:g})")
        ratio_d = summary["ours_route_node_ms"]["median"] / summary["peer_node_ms"]["median"]
        print(f"ours (c) / LangGraph (medians): {summary['ours_inline_node_ms']['median'] / summary['peer_node_ms']['median']:.2f}x; "
              f"ours (d) / LangGraph (medians): {ratio_d:.2f}x")
        over = sum(1 for r in rounds if r["ratio_route"] >= 1)
        print(f"issue #15's goal, scheduling overhead per node under LangGraph's ((d), like for like): per round "
              f"{summary['ratio_route']['min']:.2f}-{summary['ratio_route']['max']:.2f}x, "
              + ("met in every round" if not over else f"NOT met in {over} of {len(rounds)} rounds"))
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "benchmark": "flow_overhead", "nodes": NODES, "graph": f"start -> {FAN} parallel -> join -> {CHAIN} chain -> end",
            "node": f"tool bench.echo ({f'takes {args.tool_ms:g} ms' if args.tool_ms else 'returns at once'})",
            "rounds": args.rounds, "runs_per_round": args.runs,
            "worker_concurrency": None if worker is None else args.concurrency,
            "database": f"PostgreSQL {server_version}",
            "peer": {"langgraph": _version("langgraph"), "langgraph-checkpoint-postgres": _version("langgraph-checkpoint-postgres"),
                     "durability": "sync"},
            "python": platform.python_version(), "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "summary": summary, "ratio_inprocess": round(ratio_a, 3),
            "inprocess_per_node": {"queries": round(queries, 2), "transactions": round(transactions, 2)},
            "inline_per_node": {"queries": round(iq / NODES, 2), "transactions": round(it / NODES, 2)},
            "route_per_node": {"queries": round(rq / NODES, 2), "transactions": round(rt / NODES, 2)},
            "ratio_route": round(ratio_d, 3), "goal_met_every_round": not over,
            "per_round": rounds,
        }, indent=2) + "\n")
        print(f"written {out}")
        connection.close()
    finally:
        if worker is not None:
            worker.stop()
        if not args.keep_db:
            drop_database(url)
            drop_database(purl)


if __name__ == "__main__":
    main()
