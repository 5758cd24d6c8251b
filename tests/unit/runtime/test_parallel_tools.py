"""A model turn's tool calls run side by side when the executor can begin a call and answer later
(``runtime.protocols.StartsTools``; the tool gateway can), collected in the model's order."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from typing import Any

import pytest

from runtime.budgets import Stop
from runtime.memory import FunctionToolExecutor
from runtime.scripted import calls, say
from runtime.types import TerminalReason, ToolCall, ToolContext, ToolOutcome, ToolStatus
from tests.unit.runtime.helpers import Harness, harness


class Pending:
    def __init__(self, outcome: ToolOutcome | None = None, future: Future[ToolOutcome] | None = None) -> None:
        self.outcome, self.future = outcome, future

    def settled(self) -> ToolOutcome | None:
        return self.outcome

    def result(self) -> ToolOutcome:
        if self.outcome is not None:
            return self.outcome
        assert self.future is not None
        return self.future.result(timeout=10)


class Threaded(FunctionToolExecutor):
    """The in-memory executor, with ``start``: approvals decided when a call begins (as the gateway's gate), the
    function run on a thread of its own."""

    def __init__(self, base: FunctionToolExecutor) -> None:
        super().__init__(base.functions, base.needs_approval, base.decisions, base.calls)
        self.begun: list[str] = []

    def start(self, call: ToolCall, ctx: ToolContext) -> Pending:
        self.begun.append(call.id)
        if call.name in self.needs_approval and self.decisions.get(call.id) != "approved":
            return Pending(self.execute(call, ctx))
        future: Future[ToolOutcome] = Future()
        threading.Thread(target=lambda: future.set_result(self.execute(call, ctx)), daemon=True).start()
        return Pending(future=future)


def _threaded(h: Harness) -> Threaded:
    threaded = Threaded(h.executor)
    h.loop.tools = h.loop.calls.tools = threaded
    return threaded


def _meeting(parties: int) -> Any:
    barrier = threading.Barrier(parties)

    def meet(args: dict[str, Any]) -> str:
        barrier.wait(timeout=3)  # BrokenBarrierError (an ERROR outcome) when the calls run one after another
        return f"met {args['who']}"

    return meet


def test_a_turns_calls_run_side_by_side_and_their_results_come_back_in_the_models_order() -> None:
    h = harness([calls([("meet", {"who": "a"}), ("meet", {"who": "b"}), ("meet", {"who": "c"})]), say("done")],
                functions={"meet": _meeting(3)})
    threaded = _threaded(h)
    result = h.run()
    assert result.terminal_reason == TerminalReason.FINAL_ANSWER
    tool_messages = [m for m in h.messages() if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["met a", "met b", "met c"]
    assert [m["tool_call_id"] for m in tool_messages] == threaded.begun
    assert [e["payload"]["status"] for e in h.events("tool.call")] == ["ok", "ok", "ok"]


def test_without_start_or_with_a_tool_interceptor_the_calls_run_one_after_another() -> None:
    """The plain executor has no ``start``; an interceptor sees one whole call at a time: both run the calls in turn
    (here the barrier of two breaks: each call waits alone)."""
    h = harness([calls([("meet", {"who": "a"}), ("meet", {"who": "b"})]), say("done")], functions={"meet": _meeting(2)})
    h.run()
    assert [e["payload"]["status"] for e in h.events("tool.call")] == ["error", "error"]

    seen: list[str] = []

    def watch(call: ToolCall, ctx: ToolContext, call_next: Any) -> ToolOutcome:
        seen.append(call.id)
        return call_next(call, ctx)

    h = harness([calls([("lookup", {"q": 1}), ("lookup", {"q": 2})]), say("done")], tool_interceptors=[watch])
    threaded = _threaded(h)
    h.run()
    assert threaded.begun == [] and len(seen) == 2
    assert [m["content"] for m in h.messages() if m["role"] == "tool"] == ["found {'q': 1}", "found {'q': 2}"]


def test_a_call_waiting_for_approval_holds_back_the_calls_after_it_as_before() -> None:
    h = harness([calls([("lookup", {"q": 1}), ("refund", {"amount": 5}), ("lookup", {"q": 2})]), say("done")],
                functions={"lookup": lambda a: f"found {a}", "refund": lambda a: "refunded"},
                needs_approval=frozenset({"refund"}))
    threaded = _threaded(h)
    h.run()
    assert len(threaded.begun) == 2, "the call after the one waiting was not begun"
    assert [p["name"] for p in h.records()[-1].pending_calls] == ["refund", "lookup"]
    assert [m["content"] for m in h.messages() if m["role"] == "tool"] == ["found {'q': 1}"]
    assert [e["payload"]["status"] for e in h.events("tool.call")] == ["ok", "pending_approval"]


def test_a_rejection_that_stops_the_run_stops_beginning_calls() -> None:
    h = harness([calls([("lookup", {"q": 1}), ("refund", {"amount": 5}), ("lookup", {"q": 2})]), say("done")],
                functions={"lookup": lambda a: f"found {a}", "refund": lambda a: "refunded"},
                needs_approval=frozenset({"refund"}), policy={"approvals": {"stop_on_rejection": True}})
    threaded = _threaded(h)
    original = threaded.start

    def reject_refunds(call: ToolCall, ctx: ToolContext) -> Pending:
        if call.name == "refund":
            threaded.begun.append(call.id)
            return Pending(ToolOutcome(call.id, ToolStatus.REJECTED, "An approver rejected the call to refund."))
        return original(call, ctx)

    threaded.start = reject_refunds  # type: ignore[method-assign]
    result = h.run()
    assert result.terminal_reason == TerminalReason.REJECTED
    assert len(threaded.begun) == 2 and len(threaded.calls) == 1, "the third call was neither begun nor run"


def test_a_guard_stopping_mid_turn_collects_the_calls_already_begun_first() -> None:
    class SecondCheckStops:
        def __init__(self) -> None:
            self.checks = 0

        def check(self, request: Any, ctx: Any) -> Stop | None:
            if request is not None:
                return None
            self.checks += 1
            return Stop(TerminalReason.TIMEOUT, None, "time is up") if self.checks == 2 else None

    h = harness([calls([("lookup", {"q": 1}), ("lookup", {"q": 2})]), say("done")])
    threaded = _threaded(h)
    h.loop.calls.guards.append(SecondCheckStops())
    result = h.run()
    assert result.terminal_reason == TerminalReason.TIMEOUT
    assert len(threaded.begun) == 1
    assert [e["payload"]["status"] for e in h.events("tool.call")] == ["ok"], "the begun call was collected and traced"


@pytest.mark.parametrize("where", ["start", "result"])
def test_an_executor_raising_as_a_call_begins_or_ends_gives_the_model_an_error(where: str) -> None:
    h = harness([calls([("lookup", {"q": 1}), ("lookup", {"q": 2})]), say("done")])
    threaded = _threaded(h)
    original = threaded.start

    def breaks(call: ToolCall, ctx: ToolContext) -> Any:
        if call.arguments != json.dumps({"q": 2}):
            return original(call, ctx)
        if where == "start":
            raise RuntimeError("no thread")
        broken = Pending(future=Future())
        broken.future.set_exception(RuntimeError("lost"))  # type: ignore[union-attr]
        return broken

    threaded.start = breaks  # type: ignore[method-assign]
    assert h.run().terminal_reason == TerminalReason.FINAL_ANSWER
    contents = [m["content"] for m in h.messages() if m["role"] == "tool"]
    assert contents[0] == "found {'q': 1}" and "failed unexpectedly" in contents[1]


def test_at_most_tool_calls_at_once_are_under_way_together() -> None:
    """Four calls, two at a time: each pair meets at a barrier of two; never more than two run at once."""
    lock, running, most = threading.Lock(), [0], [0]
    barrier = threading.Barrier(2)

    def pair(args: dict[str, Any]) -> str:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            barrier.wait(timeout=3)
        finally:
            with lock:
                running[0] -= 1
        return f"paired {args['n']}"

    h = harness([calls([("pair", {"n": i}) for i in range(4)]), say("done")], functions={"pair": pair})
    h.loop.config.tool_calls_at_once = 2
    _threaded(h)
    assert h.run().terminal_reason == TerminalReason.FINAL_ANSWER
    assert [m["content"] for m in h.messages() if m["role"] == "tool"] == [f"paired {i}" for i in range(4)]
    assert most[0] == 2
