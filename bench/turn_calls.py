"""A model turn asking for several slow tool calls at once: ours beside LangGraph's ReAct agent.

One run: the model asks, in its first turn, for ``--calls`` calls of a tool that takes ``--tool-ms`` (default 5 calls of
50 ms), then answers. Ours is the real path (``services.execute_run``: the lease, the runtime loop, the tool gateway's
checks and audit rows, the step's commit on PostgreSQL) with a scripted model; the peer is
``langgraph.prebuilt.create_react_agent`` on ``PostgresSaver`` (``durability="sync"``), whose ``ToolNode`` runs a turn's
calls on threads. A run's time is mostly the tools' time: one after another it would be calls × tool-ms, side by side
about one tool-ms.

    .venv/bin/python bench/turn_calls.py [--calls 5 --tool-ms 50 --rounds 3 --runs 5]

Databases ``agentops_bench_turn`` and ``agentops_bench_turn_peer`` (same server as ``bench/step_overhead.py``),
created and dropped. Results: stdout and ``bench/results/turn_calls.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.step_overhead import _version, bench_url, drop_database, recreate_database, setup_django  # noqa: E402
from bench.step_peer_langgraph import scripted_chat_model  # noqa: E402

PAUSE = 0.05


def _sleep_echo(n: int) -> dict[str, Any]:
    time.sleep(PAUSE)
    return {"n": n}


class Ours:
    def __init__(self, calls: int) -> None:
        from agents.models import Agent, AgentVersion
        from tenants.models import Tenant
        from tools.pyfunc import registry, tool
        from tools.services import install_python_tool

        if "bench.slow_echo" not in registry:

            @tool(key="bench.slow_echo", category="read")
            def slow_echo(n: int) -> dict[str, Any]:
                """Return the number it is given, after a pause (a benchmark tool)."""
                return _sleep_echo(n)

        self.calls = calls
        self.tenant = Tenant.objects.create(slug="bench", name="bench")
        install_python_tool(tenant=self.tenant, key="bench.slow_echo", actor=None)
        self.agent = Agent.objects.create(tenant=self.tenant, slug="bench", name="bench")
        self.version = AgentVersion.objects.create(tenant=self.tenant, agent=self.agent, number=1, model="demo/planner",
                                                   system_prompt="You are a benchmark.", tools=["slow_echo"])

    def measure_run(self) -> float:
        from agents import model_clients, services
        from agents.models import Run, Session
        from runtime.scripted import ScriptedModel, calls, say

        session = Session.objects.create(tenant=self.tenant, agent=self.agent)
        run = Run.objects.create(tenant=self.tenant, agent=self.agent, version=self.version, session=session,
                                 input="benchmark: call slow_echo several times at once, then answer")
        model = ScriptedModel([calls([("slow_echo", {"n": i}) for i in range(self.calls)]), say("done")])
        real = model_clients.model_client_for
        model_clients.model_client_for = lambda run: model
        try:
            began = time.perf_counter()
            services.execute_run(str(run.pk))
            elapsed = time.perf_counter() - began
        finally:
            model_clients.model_client_for = real
        done = Run.objects.get(pk=run.pk)
        if done.terminal_reason != "final_answer":
            raise SystemExit(f"our run did not finish as expected: {done.terminal_reason} {done.error}")
        return elapsed


class Peer:
    def __init__(self, url: str, calls: int) -> None:
        from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
        from langchain_core.tools import tool
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.prebuilt import create_react_agent
        from psycopg import Connection
        from psycopg.rows import dict_row

        def reply(messages: list[BaseMessage]) -> AIMessage:
            """All the calls in the first turn, then the answer."""
            if any(isinstance(m, ToolMessage) for m in messages):
                return AIMessage(content="done")
            return AIMessage(content="", tool_calls=[
                {"name": "slow_echo", "args": {"n": i}, "id": f"call_{i}", "type": "tool_call"} for i in range(calls)])

        @tool
        def slow_echo(n: int) -> dict[str, Any]:
            """Return the number it is given, after a pause (a benchmark tool)."""
            return _sleep_echo(n)

        self.calls = calls
        self.conn = Connection.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        self.saver = PostgresSaver(self.conn)
        self.saver.setup()
        self.agent = create_react_agent(scripted_chat_model(reply), [slow_echo], prompt="You are a benchmark.",
                                        checkpointer=self.saver)
        self.human = HumanMessage

    def measure_run(self) -> float:
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        began = time.perf_counter()
        out = self.agent.invoke({"messages": [self.human("benchmark: call slow_echo several times at once")]}, config,
                                durability="sync")
        elapsed = time.perf_counter() - began
        if out["messages"][-1].content != "done" or sum(1 for m in out["messages"] if m.type == "tool") != self.calls:
            raise SystemExit("the peer run did not finish as expected")
        return elapsed

    def close(self) -> None:
        self.conn.close()


def main() -> None:
    global PAUSE
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=5, help="tool calls in the model's one turn (default 5)")
    parser.add_argument("--tool-ms", type=float, default=50.0, help="milliseconds each call takes (default 50)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "turn_calls.json"))
    args = parser.parse_args()
    if args.rounds < 3 or args.calls < 1:
        parser.error("--rounds must be at least 3 and --calls at least 1")
    PAUSE = args.tool_ms / 1000
    url, purl = bench_url("agentops_bench_turn"), bench_url("agentops_bench_turn_peer")
    server = recreate_database(url)
    recreate_database(purl)
    try:
        setup_django(url)
        ours, peer = Ours(args.calls), Peer(purl, args.calls)
        for _ in range(2):
            ours.measure_run()
            peer.measure_run()
        rounds = []
        for number in range(1, args.rounds + 1):
            mine = statistics.median(ours.measure_run() for _ in range(args.runs)) * 1000
            theirs = statistics.median(peer.measure_run() for _ in range(args.runs)) * 1000
            rounds.append({"round": number, "ours_ms": round(mine, 1), "peer_ms": round(theirs, 1),
                           "ratio": round(mine / theirs, 3)})
            print(f"round {number}: run ms: ours {mine:.1f}, LangGraph {theirs:.1f} ({mine / theirs:.2f}x)", flush=True)
        peer.close()
        serial = args.calls * args.tool_ms
        summary = {k: {"min": min(r[k] for r in rounds), "median": statistics.median(r[k] for r in rounds),
                       "max": max(r[k] for r in rounds)} for k in ("ours_ms", "peer_ms", "ratio")}
        print(f"\none run, one turn of {args.calls} calls of {args.tool_ms:g} ms then an answer ({serial:g} ms of tool time "
              f"one after another), {args.rounds} interleaved rounds of {args.runs} runs, PostgreSQL {server}; LangGraph "
              f"{_version('langgraph')} + PostgresSaver (durability=sync)")
        for k, label in (("ours_ms", "ours, run ms"), ("peer_ms", "LangGraph create_react_agent, run ms"),
                         ("ratio", "ours / LangGraph per round")):
            v = summary[k]
            print(f"{label:40} | {v['min']:8.2f} | {v['median']:8.2f} | {v['max']:8.2f}")
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "benchmark": "turn_calls", "calls": args.calls, "tool_ms": args.tool_ms, "rounds": args.rounds,
            "runs_per_round": args.runs, "database": f"PostgreSQL {server}", "langgraph": _version("langgraph"),
            "python": platform.python_version(), "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "summary": summary, "per_round": rounds,
        }, indent=2) + "\n")
        print(f"written {out}")
        from django.db import connection

        connection.close()
    finally:
        drop_database(url)
        drop_database(purl)


if __name__ == "__main__":
    main()
