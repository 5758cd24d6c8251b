"""Interceptors change a single call's request or response, never the state or the flow."""

from __future__ import annotations

from dataclasses import replace

from runtime.interceptors import ModelCall, ToolCallFn
from runtime.scripted import call, say
from runtime.types import ModelRequest, ModelResponse, TerminalReason, ToolCall, ToolContext, ToolOutcome
from tests.unit.runtime.helpers import harness


def redact(request: ModelRequest, call_next: ModelCall) -> ModelResponse:
    for message in request.messages:
        if isinstance(message.get("content"), str):
            message["content"] = message["content"].replace("CA1234", "[flight]")
    request.messages.append({"role": "system", "content": "Be brief."})
    return call_next(request)


def shout(request: ModelRequest, call_next: ModelCall) -> ModelResponse:
    response = call_next(request)
    return replace(response, content=(response.content or "").upper())


def test_a_model_interceptor_changes_the_request_but_not_the_conversation() -> None:
    h = harness([say("ok")], model_interceptors=[redact], state={"flight_no": "CA1234"})

    h.run()

    sent = h.model.requests[0].messages
    assert "[flight]" in sent[1]["content"] and sent[-1] == {"role": "system", "content": "Be brief."}
    log = h.messages()
    assert "CA1234" in log[1]["content"] and len(log) == 3
    assert h.state()["flight_no"] == "CA1234"


def test_a_model_interceptor_changes_the_response() -> None:
    h = harness([say("on time")], model_interceptors=[shout])
    result = h.run()
    assert result.output == "ON TIME"
    assert h.messages()[-1]["content"] == "ON TIME"


def test_an_interceptor_cannot_undo_a_budget_stop() -> None:
    def swallow(request: ModelRequest, call_next: ModelCall) -> ModelResponse:
        try:
            return call_next(request)
        except Exception:
            return say("pretend everything is fine")

    policy = {"budgets": {"max_output_tokens": 100, "run": {"tokens": 101}}}
    h = harness([say("never")], model_interceptors=[swallow], policy=policy)

    result = h.run()

    assert result.terminal_reason == TerminalReason.BUDGET_EXCEEDED
    assert h.model.requests == []


def test_a_tool_interceptor_changes_the_outcome_the_model_reads() -> None:
    def truncate(call: ToolCall, ctx: ToolContext, call_next: ToolCallFn) -> ToolOutcome:
        outcome = call_next(replace(call, arguments='{"q": "rewritten"}'), ctx)
        outcome.content = outcome.content[:12] + "…"
        return outcome

    h = harness([call("lookup", {"q": "original"}), say("ok")], tool_interceptors=[truncate])
    h.run()

    assert h.executor.calls[0].arguments == '{"q": "rewritten"}'
    tool_message = next(m for m in h.messages() if m["role"] == "tool")
    assert tool_message["content"] == "found {'q': …"


def test_interceptors_receive_no_state() -> None:
    seen: list[ModelRequest] = []

    def spy(request: ModelRequest, call_next: ModelCall) -> ModelResponse:
        seen.append(request)
        return call_next(request)

    h = harness([say("ok")], model_interceptors=[spy], state={"secret_business_key": "s3cr3t"})
    h.run()
    assert "s3cr3t" not in repr(seen[0])


def test_the_request_an_interceptor_gets_shares_nothing_mutable_with_the_run() -> None:
    """``ModelRequest.private_copy`` (what ``chain_model`` hands the interceptors) copies every nested part: a change
    to a tool call, a tool's schema or the metadata in the copy leaves the original as it was."""
    from datetime import datetime

    from runtime.types import ToolSpec

    stamp = datetime(2026, 1, 1)
    original = ModelRequest(
        model="m",
        messages=[{"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}]}],
        tools=[ToolSpec("echo", "Echo.", {"type": "object", "properties": {"n": {"type": "integer"}}})],
        metadata={"tags": ["a"], "when": [stamp], "pair": (1, [2])},
        max_output_tokens=7,
    )
    copied = original.private_copy()
    assert copied == original and copied is not original
    copied.messages[0]["tool_calls"][0]["function"]["name"] = "changed"
    copied.tools[0].parameters["properties"]["n"]["type"] = "string"
    copied.metadata["tags"].append("b")
    copied.metadata["pair"][1].append(3)
    assert original.messages[0]["tool_calls"][0]["function"]["name"] == "echo"
    assert original.tools[0].parameters["properties"]["n"]["type"] == "integer"
    assert original.metadata == {"tags": ["a"], "when": [stamp], "pair": (1, [2])}
