"""Summarization, context editing, pre-emptive compression, and the seed scenario."""

from __future__ import annotations

from typing import Any

from runtime.compaction import CLEARED, PINNED_PREFIX, SUMMARY_PREFIX, render_view, request_tokens
from runtime.loop import AgentConfig
from runtime.scripted import Reply, call, say
from runtime.types import ModelRequest, ModelResponse, TerminalReason
from tests.unit.runtime.helpers import MODEL, harness, tool_spec

WORDS = "lorem ipsum dolor sit amet consectetur "


def big(tokens: int) -> Any:
    def tool(args: dict[str, Any]) -> str:
        return f"result {args}: " + WORDS * (tokens * 4 // len(WORDS))

    return tool


def tokens_of(request: ModelRequest) -> int:
    return request_tokens(request.messages, request.tools, request.model)


def _no_tool_splits(messages: list[dict[str, Any]]) -> None:
    for index, message in enumerate(messages):
        if message["role"] == "tool":
            previous = messages[index - 1]
            assert previous["role"] == "tool" or previous.get("tool_calls"), f"orphan tool result at {index}"


def test_seed_scenario_a_growing_tool_loop_is_stopped_by_the_run_limit_and_stays_in_the_window() -> None:
    # given: the model keeps calling tools, each result adds ~800 tokens, the window is 4,000 tokens
    policy = {
        "limits": {"model_calls": {"run_limit": 5}},
        "context": {
            "context_window": 4000,
            "summarization": {"enabled": True, "token_threshold": 2000, "keep_last": 4},
            "compression": {"window_share": 0.7},
        },
    }
    replies = [call("search", {"page": i}) for i in range(9)]
    h = harness(replies, policy=policy, functions={"search": big(800)})

    # when
    result = h.run()

    # then: a friendly stop after 5 calls, every request under 70% of the window
    assert result.terminal_reason == TerminalReason.LIMIT_REACHED
    assert result.output and "maximum number of steps" in result.output
    assert len(h.model.requests) == 5
    assert all(tokens_of(r) <= 2800 for r in h.model.requests), [tokens_of(r) for r in h.model.requests]
    assert h.model.requests[-1].messages[0]["content"] == "You are a travel assistant."
    assert h.events("context.summarized")
    assert h.terminal_reasons() == [TerminalReason.LIMIT_REACHED]


def test_summarization_condenses_older_messages_through_the_model_client() -> None:
    policy = {
        "context": {"summarization": {"enabled": True, "token_threshold": 600, "keep_last": 2, "model": "cheap-model"}},
        "loop_detection": {"enabled": False},
    }
    replies = [call("search", {"page": i}) for i in range(4)] + [say("done")]
    h = harness(replies, policy=policy, functions={"search": big(200)})

    assert h.run().terminal_reason == TerminalReason.FINAL_ANSWER

    assert h.model.summary_requests, "a summary was requested"
    summary_request = h.model.summary_requests[0]
    assert summary_request.task == "summarize" and summary_request.model == "cheap-model"
    last = h.model.requests[-1].messages
    assert last[0] == {"role": "system", "content": "You are a travel assistant."}
    assert last[1]["content"].startswith(SUMMARY_PREFIX)
    _no_tool_splits(last)
    assert last[2]["role"] != "tool"
    log = h.messages()
    assert len([m for m in log if m["role"] == "tool"]) == 4  # the log itself is never rewritten
    summary_calls = [e for e in h.events("model.call") if e["payload"]["task"] == "summarize"]
    assert summary_calls and summary_calls[0]["payload"]["model"] == "scripted"


def test_context_editing_changes_only_the_request() -> None:
    policy = {
        "context": {"editing": {"enabled": True, "trigger": 500, "keep": 300, "exclude_tools": ["profile"]}},
        "loop_detection": {"enabled": False},
    }
    replies = [call("profile", {}), call("search", {"page": 1}), call("search", {"page": 2}), say("done")]
    h = harness(replies, policy=policy, functions={"search": big(200), "profile": big(150)})

    h.run()

    last = h.model.requests[-1].messages
    tool_messages = [m for m in last if m["role"] == "tool"]
    assert tool_messages[0]["name"] == "profile" and tool_messages[0]["content"] != CLEARED  # excluded
    assert tool_messages[1]["content"] == CLEARED  # the oldest search result
    assert tool_messages[-1]["content"] != CLEARED  # the newest result is always kept
    assert all(m["content"] != CLEARED for m in h.messages() if m["role"] == "tool")  # state untouched
    assert "_context" not in h.state()
    edited = h.events("context.edited")
    assert edited and edited[-1]["payload"]["tokens_after"] < edited[-1]["payload"]["tokens_before"]


def test_compression_clears_raw_tool_output_first() -> None:
    policy = {
        "context": {"context_window": 2000, "compression": {"window_share": 0.7}},
        "loop_detection": {"enabled": False},
    }
    replies = [call("search", {"page": i}) for i in range(3)] + [say("done")]
    h = harness(replies, policy=policy, functions={"search": big(600)})

    h.run()

    assert not h.model.summary_requests  # clearing tool output was enough
    assert all(tokens_of(r) <= 1400 for r in h.model.requests)
    assert h.events("context.compressed")


def test_compression_summarises_older_turns_and_pins_key_facts() -> None:
    policy = {
        "context": {
            "context_window": 2000,
            "compression": {"window_share": 0.7, "keep_last": 2, "pin_state_keys": ["flight_no"]},
        },
        "loop_detection": {"enabled": False},
    }

    def talkative(request: ModelRequest) -> ModelResponse:
        return call("note", {"text": "booking BK-77812 " + WORDS * 60})

    replies: list[Reply] = [talkative, talkative, talkative, talkative, say("Your flight CA1234 is on time.")]
    h = harness(replies, policy=policy, functions={"note": lambda a: "noted"}, state={"flight_no": "CA1234"})

    h.run()

    assert h.model.summary_requests
    last = h.model.requests[-1].messages
    assert last[0]["content"] == "You are a travel assistant."  # the system prompt is never compressed
    assert last[1]["content"].startswith(PINNED_PREFIX)
    assert "flight_no: CA1234" in last[1]["content"] and "BK-77812" in last[1]["content"]
    assert last[2]["content"].startswith(SUMMARY_PREFIX)
    _no_tool_splits(last)
    assert all(tokens_of(r) <= 1400 for r in h.model.requests), [tokens_of(r) for r in h.model.requests]


def test_the_view_renders_summary_after_the_system_prompt() -> None:
    log = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
    ]
    state = {"_context": {"summary": "s", "through": 3, "identifiers": [], "pin_keys": []}}
    view = render_view(log, state)
    assert [m["content"] for m in view] == ["sys", SUMMARY_PREFIX + "s", "q2"]


def test_budget_also_bounds_the_summary_call() -> None:
    policy = {
        "context": {"summarization": {"enabled": True, "token_threshold": 300, "keep_last": 2, "max_summary_tokens": 400}},
        "budgets": {"max_output_tokens": 100, "run": {"tokens": 900}},
        "loop_detection": {"enabled": False},
    }
    replies = [call("search", {"page": i}) for i in range(6)]
    config = AgentConfig(MODEL, "p", [tool_spec("search")])
    h = harness(replies, policy=policy, functions={"search": big(150)}, config=config, measure_usage=True)

    result = h.run()

    assert result.terminal_reason == TerminalReason.BUDGET_EXCEEDED
    assert result.usage.total_tokens <= 900
