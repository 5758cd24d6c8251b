"""Condensing the context never loses the current user turn, the system prompt or the pinned facts.

Each test checks the exact requests the model was sent (the scripted model records them after
every interceptor), and that their message order is one the OpenAI protocol accepts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runtime.compaction import CLEARED, PINNED_PREFIX, SUMMARY_PREFIX, request_tokens
from runtime.protocols import Checkpoint
from runtime.scripted import Reply, call, say
from runtime.types import ModelRequest, ModelResponse, TerminalReason
from tests.unit.runtime.helpers import Harness, harness

WORDS = "lorem ipsum dolor sit amet consectetur "
SYSTEM = {"role": "system", "content": "You are a travel assistant."}
FACTS = {"role": "system", "content": "About this organisation:\n- airline: Example Air"}
QUESTION = {"role": "user", "content": "And is my connecting flight CA1234 to Berlin still on time?"}


def big(tokens: int) -> Any:
    def tool(args: dict[str, Any]) -> str:
        return f"result {args}: " + WORDS * (tokens * 4 // len(WORDS))

    return tool


def session_history(turns: int, words: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for turn in range(turns):
        history.append({"role": "user", "content": f"Earlier question {turn}: " + WORDS * words})
        history.append({"role": "assistant", "content": f"Earlier answer {turn}: " + WORDS * words})
    return history


def run_with(
    replies: Sequence[Reply],
    policy: Mapping[str, Any],
    functions: Mapping[str, Any],
    *,
    history: Sequence[dict[str, Any]] = (),
    state: Mapping[str, Any] | None = None,
) -> Harness:
    h = harness(replies, policy=policy, functions=functions)
    messages = [dict(SYSTEM), dict(FACTS), *(dict(m) for m in history), dict(QUESTION)]
    h.store.create(h.run_id, Checkpoint(messages=messages, state=dict(state or {})))
    return h


def assert_valid_order(messages: list[dict[str, Any]]) -> None:
    """System messages first, then a user message; every tool result answers the assistant
    message right before its group, and every tool call is answered."""
    roles = [m["role"] for m in messages]
    first_other = next(i for i, r in enumerate(roles) if r != "system")
    assert "system" not in roles[first_other:], roles
    assert roles[first_other] == "user", f"the first message after the system messages is {roles[first_other]}"
    open_ids: set[str] = set()
    for index, message in enumerate(messages):
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_ids, f"orphan tool result at {index}: {roles}"
            open_ids.discard(message["tool_call_id"])
            continue
        assert not open_ids, f"tool calls {open_ids} left unanswered before message {index}: {roles}"
        if message["role"] == "assistant":
            open_ids = {c["id"] for c in message.get("tool_calls") or []}
    assert not open_ids


def assert_keeps_the_turn(request: ModelRequest, *, pinned: Sequence[str] = ()) -> None:
    messages = request.messages
    assert messages[0] == SYSTEM
    assert messages[1] == FACTS
    users = [m for m in messages if m["role"] == "user"]
    assert users and users[-1] == QUESTION, f"the current user turn is missing: {[m['role'] for m in messages]}"
    assert users.count(QUESTION) == 1
    for fact in pinned:
        assert any(m["role"] == "system" and fact in str(m["content"]) for m in messages), fact
    assert_valid_order(messages)


def test_summarization_of_a_long_history_keeps_the_current_turn_verbatim() -> None:
    # given: a session with a long history, and a turn that calls tools several times
    policy = {
        "context": {"summarization": {"enabled": True, "token_threshold": 900, "keep_last": 2}},
        "loop_detection": {"enabled": False},
    }
    replies = [call("search", {"page": i}) for i in range(4)] + [say("Yes, CA1234 is on time.")]
    h = run_with(replies, policy, {"search": big(150)}, history=session_history(3, 20))

    # when
    result = h.run()

    # then: the history was condensed, yet every request still carries the question, verbatim
    assert result.terminal_reason == TerminalReason.FINAL_ANSWER
    assert h.model.summary_requests
    summarized = [r for r in h.model.requests if any(str(m["content"]).startswith(SUMMARY_PREFIX) for m in r.messages)]
    assert len(summarized) >= 2
    for request in h.model.requests:
        assert_keeps_the_turn(request)
    last = h.model.requests[-1].messages
    assert [m["role"] for m in last[:4]] == ["system", "system", "system", "user"]
    assert last[2]["content"].startswith(SUMMARY_PREFIX)


def test_compression_at_70_percent_keeps_the_current_turn_and_the_pinned_facts() -> None:
    # given: compression at 70 % of a 2,000-token window; the model's notes fill it fast
    policy = {
        "context": {
            "context_window": 2000,
            "compression": {"window_share": 0.7, "keep_last": 2, "pin_state_keys": ["flight_no"]},
        },
        "loop_detection": {"enabled": False},
    }

    def talkative(request: ModelRequest) -> ModelResponse:
        return call("note", {"text": "booking BK-77812 " + WORDS * 60})

    replies: list[Reply] = [talkative] * 5 + [say("Your flight CA1234 is on time.")]
    h = run_with(replies, policy, {"note": lambda a: "noted"}, history=session_history(1, 10), state={"flight_no": "CA1234"})

    # when
    h.run()

    # then: the request after each summary still has the question, the facts and the pins
    assert h.model.summary_requests
    compressed = [r for r in h.model.requests if any(str(m["content"]).startswith(SUMMARY_PREFIX) for m in r.messages)]
    assert compressed
    for request in compressed:
        assert_keeps_the_turn(request, pinned=[PINNED_PREFIX + "- flight_no: CA1234", "BK-77812"])
        assert request_tokens(request.messages, request.tools, request.model) <= 1400
    for request in h.model.requests:
        assert_keeps_the_turn(request)


def test_context_editing_clears_tool_results_but_keeps_the_turn_and_the_order() -> None:
    # given
    policy = {
        "context": {"editing": {"enabled": True, "trigger": 500, "keep": 300}},
        "loop_detection": {"enabled": False},
    }
    replies = [call("search", {"page": i}) for i in range(3)] + [say("done")]
    h = run_with(replies, policy, {"search": big(200)})

    # when
    h.run()

    # then
    last = h.model.requests[-1]
    assert any(m["role"] == "tool" and m["content"] == CLEARED for m in last.messages)
    for request in h.model.requests:
        assert_keeps_the_turn(request)
