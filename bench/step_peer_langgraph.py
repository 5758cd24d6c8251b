"""The peer of ``step_overhead.py``: the same 10-step run in LangGraph with PostgresSaver (synchronous durability).

``langgraph.prebuilt.create_react_agent`` with a zero-latency scripted chat model that asks for a trivial
``echo`` tool nine times, then answers (10 model calls), checkpointed by ``langgraph-checkpoint-postgres``'s
``PostgresSaver`` with ``durability="sync"`` (each step's checkpoint is written before the next step starts),
on the same PostgreSQL server as ours, in a database of its own (created and dropped here). Each run starts
with the same history as ours (``--history`` messages) and a fresh thread.

Steps are cut at each model call, as in ``step_overhead.py``: step *i* is the time from model call *i* to
model call *i+1* (the last one ends when ``invoke`` returns).

Needs ``requirements-bench.txt`` (never in requirements.txt). ``make bench`` runs it interleaved with ours
(``step_overhead.py --peer``); alone:

    .venv/bin/python bench/step_peer_langgraph.py [--runs 20] [--history 10]

Database: ``BENCH_PEER_DATABASE_URL``, else the server of ``BENCH_DATABASE_URL``/``DATABASE_URL`` (or
``postgres://postgres@127.0.0.1:5432``) with the database ``agentops_bench_peer``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

STEPS = 10
PEER_DB = "agentops_bench_peer"


def peer_url() -> str:
    if os.environ.get("BENCH_PEER_DATABASE_URL"):
        return os.environ["BENCH_PEER_DATABASE_URL"]
    base = os.environ.get("BENCH_DATABASE_URL") or os.environ.get("DATABASE_URL", "")
    if base.startswith(("postgres://", "postgresql://")):
        parts = urlsplit(base)
        return urlunsplit(("postgresql", parts.netloc, f"/{PEER_DB}", "", ""))
    return f"postgresql://postgres@127.0.0.1:5432/{PEER_DB}"


def _admin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not re.fullmatch(r"[A-Za-z0-9_]+", name) or "bench" not in name:
        sys.exit(f"refusing to drop {name!r}: the peer benchmark database's name must contain 'bench'")
    return urlunsplit(("postgresql", parts.netloc, "/postgres", "", "")), name


def recreate_database(url: str) -> None:
    import psycopg

    admin, name = _admin(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    import psycopg

    admin, name = _admin(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def scripted_chat_model(reply: Any) -> Any:
    """A zero-latency langchain chat model whose every answer is ``reply(messages)`` (an ``AIMessage``), for the
    peers' ``create_react_agent`` (``bench/turn_calls.py`` uses it too)."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import BaseMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class ScriptedChatModel(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            return ChatResult(generations=[ChatGeneration(message=reply(messages))])

    return ScriptedChatModel()


class Peer:
    """A compiled ReAct agent on PostgresSaver; ``measure_run`` times one 10-step run, cut at each model call."""

    def __init__(self, url: str, history_messages: int = 10) -> None:
        from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
        from langchain_core.tools import tool
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.prebuilt import create_react_agent
        from psycopg import Connection
        from psycopg.rows import dict_row

        self.cuts: list[float] = []
        cuts = self.cuts

        def reply(messages: list[BaseMessage]) -> AIMessage:
            """Asks for ``echo`` until it has seen nine tool results, then answers."""
            cuts.append(time.perf_counter())
            seen = sum(1 for m in messages if isinstance(m, ToolMessage))
            if seen < STEPS - 1:
                return AIMessage(content="", tool_calls=[{"name": "echo", "args": {"n": seen}, "id": f"call_{seen}",
                                                          "type": "tool_call"}])
            return AIMessage(content="done")

        @tool
        def echo(n: int) -> dict[str, Any]:
            """Return the number it is given (a trivial tool for the benchmark)."""
            return {"n": n}

        # As PostgresSaver.from_conn_string does, but held open for the whole benchmark.
        self.conn = Connection.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        self.saver = PostgresSaver(self.conn)
        self.saver.setup()
        self.agent = create_react_agent(scripted_chat_model(reply), [echo], prompt="You are a benchmark.", checkpointer=self.saver)
        history: list[BaseMessage] = []
        for i in range(history_messages // 2):
            history += [HumanMessage(f"earlier question {i}"), AIMessage(f"earlier answer {i}: " + "lorem ipsum " * 8)]
        self.history = history
        self.human = HumanMessage

    def measure_run(self) -> tuple[float, list[float]]:
        """(run seconds, [step seconds × 10])."""
        self.cuts.clear()
        config = {"configurable": {"thread_id": str(uuid.uuid4())}, "recursion_limit": 2 * STEPS + 5}
        started = time.perf_counter()
        out = self.agent.invoke({"messages": [*self.history, self.human("benchmark: call echo nine times, then answer")]},
                                config, durability="sync")
        ended = time.perf_counter()
        if len(self.cuts) != STEPS or out["messages"][-1].content != "done":
            raise SystemExit(f"the peer run did not finish as expected: {len(self.cuts)} model calls")
        marks = [*self.cuts, ended]
        return ended - started, [b - a for a, b in itertools.pairwise(marks)]

    def close(self) -> None:
        self.conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--history", type=int, default=10)
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args()
    url = peer_url()
    recreate_database(url)
    try:
        peer = Peer(url, args.history)
        for _ in range(args.warmup):
            peer.measure_run()
        runs = [peer.measure_run() for _ in range(args.runs)]
        peer.close()
        steps = [s for _, ss in runs for s in ss]
        print(f"LangGraph + PostgresSaver (durability=sync), {STEPS}-step run, history {args.history}, {args.runs} runs:")
        print(f"  run ms median {statistics.median(r for r, _ in runs) * 1000:.1f}; "
              f"step ms min/median/max {min(steps) * 1000:.2f} / {statistics.median(steps) * 1000:.2f} / {max(steps) * 1000:.2f}")
    finally:
        if not args.keep_db:
            drop_database(url)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
