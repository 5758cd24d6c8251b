"""RunState merge rules, the 'messages' rule (save time and run time), hooks, JSON round-trips."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from runtime.config import PolicyError, parse_policy
from runtime.hooks import END, HookConfigError, HookContext, HookPosition, HookResult
from runtime.loop import AgentLoop
from runtime.protocols import Checkpoint
from runtime.scripted import call, say
from runtime.serde import checkpoint_from_json, checkpoint_to_json, record_from_dict, record_to_dict
from runtime.state import MergeStrategy, StateError, StateSchema
from runtime.types import Phase, TerminalReason, Usage
from tests.unit.runtime.helpers import harness


@dataclass(frozen=True)
class PyHook:
    name: str
    positions: frozenset[HookPosition]
    result: HookResult | None = None

    def __call__(self, ctx: HookContext) -> HookResult | None:
        return self.result


def test_merge_appends_or_replaces_by_strategy() -> None:
    schema = StateSchema({"visited": MergeStrategy.APPEND})
    state = schema.merge({"visited": ["PEK"], "flight_no": "CA1"}, {"visited": "SHA", "flight_no": "CA2"}, source="t")
    assert state == {"visited": ["PEK", "SHA"], "flight_no": "CA2"}
    state = schema.merge(state, {"visited": ["CAN", "HKG"]}, source="t")
    assert state["visited"] == ["PEK", "SHA", "CAN", "HKG"]


def test_messages_and_bookkeeping_keys_are_refused_with_a_clear_error() -> None:
    schema = StateSchema()
    with pytest.raises(StateError, match="double the tokens"):
        schema.merge({}, {"messages": [{"role": "user", "content": "x"}]}, source="hook 'h'")
    with pytest.raises(StateError, match="belong to the agent loop"):
        schema.merge({}, {"_terminal_reason": "final_answer"}, source="hook 'h'")
    with pytest.raises(StateError, match="JSON"):
        schema.merge({}, {"when": object()}, source="hook 'h'")


def test_a_configured_hook_writing_messages_is_refused_when_the_version_is_saved() -> None:
    policy = {"hooks": [{"name": "inject", "kind": "set_state", "position": "before_model", "values": {"messages": []}}]}
    with pytest.raises(PolicyError) as info:
        parse_policy(policy)
    assert any(e.startswith("hooks[0].values.messages:") and "double the tokens" in e for e in info.value.errors)


def test_a_python_hook_writing_messages_ends_the_run_with_a_configuration_error() -> None:
    bad = PyHook("inject", frozenset({HookPosition.BEFORE_MODEL}), HookResult(updates={"messages": [{"role": "user"}]}))
    h = harness([say("never")], extra=lambda rt: rt.hooks.append(bad))

    result = h.run()

    assert result.terminal_reason == TerminalReason.ERROR
    reason = h.events("run.finished")[0]["payload"]["reason"]
    assert "hook 'inject' at before_model" in reason and "messages" in reason
    assert h.model.requests == []
    assert [m["role"] for m in h.messages()] == ["system", "user"]  # nothing duplicated


def test_hook_name_clash_is_refused_at_validation() -> None:
    hooks = [
        {"name": "tag", "kind": "set_state", "position": "before_agent", "values": {"a": 1}},
        {"name": "tag", "kind": "set_state", "position": "after_agent", "values": {"b": 2}},
        {"name": "loop_detection", "kind": "set_state", "position": "before_agent", "values": {"c": 3}},
    ]
    with pytest.raises(PolicyError) as info:
        parse_policy({"hooks": hooks})
    text = str(info.value)
    assert "'tag' is used twice" in text
    assert "hooks[2].name: 'loop_detection' is the name of a built-in hook" in text


def test_python_hooks_with_the_same_name_are_refused_when_the_loop_is_built() -> None:
    h = harness([say("x")])
    a = PyHook("same", frozenset({HookPosition.BEFORE_MODEL}))
    with pytest.raises(HookConfigError, match="used twice"):
        AgentLoop(h.loop.config, h.model, h.executor, h.store, hooks=[a, a])


def test_set_state_hook_writes_business_keys_that_never_reach_the_model() -> None:
    policy = {"hooks": [{"name": "tag", "kind": "set_state", "position": "before_agent", "values": {"segment": "gold"}}]}
    h = harness([say("ok")], policy=policy, state={"flight_no": "CA1234", "user_tier": "vip"})

    h.run()

    state = h.state()
    assert state["segment"] == "gold" and state["flight_no"] == "CA1234"
    sent = json.dumps(h.model.requests[0].messages)
    assert "gold" not in sent and "vip" not in sent and "llm_call_count" not in sent
    decisions = [e["payload"] for e in h.events("hook.decision") if e["payload"]["hook"] == "tag"]
    assert decisions == [{"hook": "tag", "position": "before_agent", "updates": ["segment"], "jump_to": None, "reason": "set_state"}]


def test_a_hook_can_end_the_run_gracefully_with_a_message() -> None:
    stop = PyHook(
        "business_hours",
        frozenset({HookPosition.BEFORE_MODEL}),
        HookResult(jump_to=END, message="We are closed; an agent will call you back.", reason="outside business hours"),
    )
    h = harness([say("never")], extra=lambda rt: rt.hooks.append(stop))

    result = h.run()

    assert result.terminal_reason == TerminalReason.LIMIT_REACHED
    assert result.output == "We are closed; an agent will call you back."
    assert h.messages()[-1] == {"role": "assistant", "content": "We are closed; an agent will call you back."}
    decision = next(e for e in h.events("hook.decision") if e["payload"]["hook"] == "business_hours")
    assert decision["payload"]["jump_to"] == "end" and decision["payload"]["position"] == "before_model"
    assert h.events("run.finished")[0]["payload"]["decided_by"] == "business_hours"


def test_stop_when_hook_ends_the_run_when_a_state_key_matches() -> None:
    policy = {
        "hooks": [
            {
                "name": "handoff",
                "kind": "stop_when",
                "key": "escalated",
                "equals": True,
                "message": "A human takes over.",
            }
        ]
    }
    h = harness([say("never")], policy=policy, state={"escalated": True})
    result = h.run()
    assert result.terminal_reason == TerminalReason.LIMIT_REACHED and result.output == "A human takes over."


def test_after_model_hook_ending_the_run_answers_the_open_tool_calls() -> None:
    stop = PyHook("stop_after", frozenset({HookPosition.AFTER_MODEL}), HookResult.end("Stopping.", reason="test"))
    h = harness([call("lookup", {"q": 1}, call_id="c1")], extra=lambda rt: rt.hooks.append(stop))

    h.run()

    roles = [m["role"] for m in h.messages()]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert h.executor.calls == []


def test_after_agent_hook_sees_the_terminal_reason_and_cannot_change_it() -> None:
    seen: list[Any] = []

    @dataclass(frozen=True)
    class Recorder:
        name: str = "recorder"
        positions: frozenset[HookPosition] = frozenset({HookPosition.AFTER_AGENT})

        def __call__(self, ctx: HookContext) -> HookResult | None:
            seen.append(ctx.terminal_reason)
            return HookResult(updates={"outcome": str(ctx.terminal_reason)}, jump_to=END)

    h = harness([say("done")], hooks=[Recorder()])
    result = h.run()

    assert seen == [TerminalReason.FINAL_ANSWER]
    assert result.terminal_reason == TerminalReason.FINAL_ANSWER
    assert h.state()["outcome"] == "final_answer"


def test_a_hook_that_raises_ends_the_run_as_error_naming_the_hook() -> None:
    @dataclass(frozen=True)
    class Broken:
        name: str = "broken"
        positions: frozenset[HookPosition] = frozenset({HookPosition.BEFORE_MODEL})

        def __call__(self, ctx: HookContext) -> HookResult | None:
            raise KeyError("tier table")

    h = harness([say("x")], hooks=[Broken()])
    assert h.run().terminal_reason == TerminalReason.ERROR
    assert "hook 'broken' failed at before_model" in h.events("run.finished")[0]["payload"]["reason"]


def test_hooks_get_a_read_only_copy_of_the_state() -> None:
    @dataclass(frozen=True)
    class Mutator:
        name: str = "mutator"
        positions: frozenset[HookPosition] = frozenset({HookPosition.BEFORE_MODEL})

        def __call__(self, ctx: HookContext) -> HookResult | None:
            with pytest.raises(TypeError):
                ctx.state["flight_no"] = "hacked"  # type: ignore[index]
            return None

    h = harness([say("x")], hooks=[Mutator()], state={"flight_no": "CA1"})
    h.run()
    assert h.state()["flight_no"] == "CA1"


def test_checkpoint_and_records_round_trip_through_json() -> None:
    h = harness([call("lookup", {"q": "CA1234"}), say("ok")], state={"flight_no": "CA1234", "visited": ["PEK"]})
    h.run()
    checkpoint = h.store.load("run-1")

    again = checkpoint_from_json(checkpoint_to_json(checkpoint))

    assert again == checkpoint
    assert again.phase == Phase.FINISHED and again.usage == checkpoint.usage
    for record in h.records():
        assert record_from_dict(json.loads(json.dumps(record_to_dict(record)))) == record
    fresh = Checkpoint(messages=[{"role": "user", "content": "hi"}], state={"a": [1, {"b": None}]}, usage=Usage(1, 2, 0.5))
    assert checkpoint_from_json(checkpoint_to_json(fresh)) == fresh
