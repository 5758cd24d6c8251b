"""Built-in limits: model calls per run/session, tiers, budgets, wall time, loop detection."""

from __future__ import annotations

from typing import Any

from runtime.loop import AgentConfig
from runtime.scripted import call, say
from runtime.types import TerminalReason, ToolOutcome, ToolStatus, Usage
from tests.unit.runtime.helpers import MODEL, harness, tool_spec


def _tools_forever(n: int = 20) -> list[Any]:
    return [call("lookup", {"page": i}) for i in range(n)]


def test_run_limit_ends_gracefully_with_a_friendly_message() -> None:
    h = harness(_tools_forever(), policy={"limits": {"model_calls": {"run_limit": 3}}})

    result = h.run()

    assert result.terminal_reason == TerminalReason.LIMIT_REACHED
    assert "maximum number of steps" in (result.output or "")
    assert len(h.model.requests) == 3
    assert h.state()["llm_call_count"] == 3
    assert h.terminal_reasons() == [TerminalReason.LIMIT_REACHED]
    assert "run model-call limit 3" in h.events("run.finished")[0]["payload"]["reason"]


def test_run_limit_with_exit_behavior_error_ends_as_error() -> None:
    policy = {"limits": {"model_calls": {"run_limit": 2, "exit_behavior": "error"}}}
    h = harness(_tools_forever(), policy=policy)
    result = h.run()
    assert result.terminal_reason == TerminalReason.ERROR and result.output is None
    assert len(h.model.requests) == 2


def test_thread_limit_counts_the_sessions_earlier_calls() -> None:
    policy = {"limits": {"model_calls": {"run_limit": 10, "thread_limit": 5}}}
    h = harness(_tools_forever(), policy=policy, state={"session_model_calls": 4})

    result = h.run()

    assert result.terminal_reason == TerminalReason.LIMIT_REACHED
    assert len(h.model.requests) == 1
    assert "this conversation" in (result.output or "")


def test_tier_limit_reads_the_tier_from_state_and_the_tenant_table() -> None:
    policy = {"limits": {"tiers": {"enabled": True, "table": {"free": 2, "vip": 4}}, "model_calls": {"run_limit": None}}}
    free = harness(_tools_forever(), policy=policy, state={"user_tier": "free"})
    vip = harness(_tools_forever(), policy=policy, state={"user_tier": "vip"})
    unknown = harness(_tools_forever(), policy=policy, state={"user_tier": "mystery"})

    assert free.run().terminal_reason == TerminalReason.LIMIT_REACHED
    vip.run()
    unknown.run()

    assert len(free.model.requests) == 2
    assert len(vip.model.requests) == 4
    assert len(unknown.model.requests) == 2  # fail closed: the smallest limit
    assert "tier 'free' allows 2" in free.events("run.finished")[0]["payload"]["reason"]


def _priced(**kwargs: Any) -> AgentConfig:
    return AgentConfig(MODEL, "p", [tool_spec("lookup")], input_price_per_million=1000.0, output_price_per_million=2000.0, **kwargs)


def test_token_budget_stops_before_the_call_that_could_cross_it() -> None:
    policy = {"budgets": {"max_output_tokens": 50, "run": {"tokens": 400}}, "loop_detection": {"enabled": False}}
    h = harness(_tools_forever(), policy=policy, measure_usage=True)

    result = h.run()

    assert result.terminal_reason == TerminalReason.BUDGET_EXCEEDED
    assert "budget" in (result.output or "")
    assert result.usage.total_tokens <= 400
    assert h.terminal_reasons() == [TerminalReason.BUDGET_EXCEEDED]


def test_cost_budget_uses_the_agents_prices_and_never_ends_above_it() -> None:
    policy = {"budgets": {"max_output_tokens": 20, "run": {"cost": 0.5}}, "loop_detection": {"enabled": False}}
    h = harness(_tools_forever(), policy=policy, config=_priced(), measure_usage=True)

    result = h.run()

    assert result.terminal_reason == TerminalReason.BUDGET_EXCEEDED
    assert 0 < result.usage.cost <= 0.5
    costs = [e["payload"]["cost"] for e in h.events("model.call")]
    assert all(c > 0 for c in costs)


def test_session_budget_counts_earlier_usage_of_the_session() -> None:
    policy = {"budgets": {"max_output_tokens": 50, "session": {"tokens": 1000}}}
    h = harness([say("hi")], policy=policy, state={"session_usage": {"input_tokens": 900, "output_tokens": 80}})

    result = h.run()

    assert result.terminal_reason == TerminalReason.BUDGET_EXCEEDED
    assert h.model.requests == []
    assert "conversation" in (result.output or "")


def test_wall_time_ends_the_run_as_timeout() -> None:
    policy = {"budgets": {"run": {"wall_seconds": 30}}, "loop_detection": {"enabled": False}}
    h = harness([], policy=policy)

    def slow(args: dict[str, Any]) -> str:
        h.clock.advance(20)
        return "slow result"

    h.executor.functions = {"lookup": slow}
    h.model.replies = _tools_forever()
    result = h.run()

    assert result.terminal_reason == TerminalReason.TIMEOUT
    assert len(h.model.requests) == 2
    assert "ran out of time" in (result.output or "")


def test_waiting_for_approval_does_not_count_as_wall_time() -> None:
    policy = {"budgets": {"run": {"wall_seconds": 30}}}
    h = harness(
        [call("book", {"f": 1}, call_id="c1"), say("Booked.")],
        policy=policy,
        functions={"book": lambda a: "ok"},
        needs_approval=frozenset({"book"}),
    )
    h.run()
    h.clock.advance(3600)  # the approver took an hour
    h.executor.decisions["c1"] = "approved"
    assert h.run().terminal_reason == TerminalReason.FINAL_ANSWER


def test_the_same_call_repeated_k_times_is_a_loop() -> None:
    replies = [call("lookup", {"flight": "CA1234", "day": 1}) for _ in range(5)]
    replies[1] = call("lookup", '{"day": 1,  "flight": "CA1234"}')  # other key order and spacing: the same call
    h = harness(replies, policy={"loop_detection": {"max_repeats": 3}})

    result = h.run()

    assert result.terminal_reason == TerminalReason.LOOP_DETECTED
    assert len(h.model.requests) == 3
    assert len(h.executor.calls) == 2  # the third identical call is not executed
    assert "3 times" in h.events("run.finished")[0]["payload"]["reason"]


def test_k_tool_failures_in_a_row_is_a_loop() -> None:
    def failing(args: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome("x", ToolStatus.ERROR, "upstream 500")

    h = harness(_tools_forever(), functions={"lookup": failing}, policy={"loop_detection": {"max_consecutive_failures": 3}})

    result = h.run()

    assert result.terminal_reason == TerminalReason.LOOP_DETECTED
    assert len(h.executor.calls) == 3
    assert "3 tool calls failed in a row" in h.events("run.finished")[0]["payload"]["reason"]


def test_usage_reported_with_a_cost_is_kept() -> None:
    h = harness([say("hi", usage=Usage(100, 10, 0.25))], config=_priced())
    assert h.run().usage == Usage(100, 10, 0.25)
