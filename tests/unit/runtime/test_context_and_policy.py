"""Context contributors, policy validation at save time, and building the runtime from a policy."""

from __future__ import annotations

import json

import pytest

from runtime.config import DEFAULT_POLICY, PolicyError, build_runtime, check_policy, parse_policy
from runtime.context import ContextInput, Turn, assemble_context
from runtime.limits import LoopDetection, ModelCallLimit, TierLimit
from runtime.loop import AgentConfig
from runtime.memory import FunctionToolExecutor, InMemoryRunStore
from runtime.scripted import ScriptedModel, say
from runtime.serde import checkpoint_from_json, checkpoint_to_json
from runtime.state import StateError
from runtime.types import TerminalReason
from tests.unit.runtime.helpers import MODEL


def _turn(seq: int, question: str, answer: str) -> Turn:
    return Turn(seq, [{"role": "user", "content": question}, {"role": "assistant", "content": answer}])


def test_contributors_assemble_prompt_facts_history_and_question_in_order() -> None:
    source = ContextInput(
        model=MODEL,
        system_prompt="You are a travel assistant.",
        user_message="And tomorrow?",
        history=[_turn(2, "Status of CA1234?", "On time."), _turn(1, "Hello", "Hi!")],
        tenant_facts={"airline": "Example Air"},
        user_facts={"name": "Ada"},
        business={"flight_no": "CA1234"},
        user_tier="vip",
        session_model_calls=7,
        session_usage={"input_tokens": 1200, "output_tokens": 300, "cost": 0.01, "wall_seconds": 12.5},
    )

    checkpoint = assemble_context(source)

    contents = [m["content"] for m in checkpoint.messages]
    assert contents[0] == "You are a travel assistant."
    assert "Example Air" in contents[1] and "Ada" in contents[1]
    assert contents[2:] == ["Hello", "Hi!", "Status of CA1234?", "On time.", "And tomorrow?"]
    assert checkpoint.state["flight_no"] == "CA1234" and checkpoint.state["user_tier"] == "vip"
    assert checkpoint.state["session_model_calls"] == 7
    assert "vip" not in json.dumps(checkpoint.messages)
    assert [r["name"] for r in checkpoint.state["_assembly"]] == [
        "system_prompt",
        "facts",
        "history",
        "user_message",
        "business_keys",
    ]
    assert checkpoint_from_json(checkpoint_to_json(checkpoint)) == checkpoint


def test_history_keeps_the_most_recent_whole_turns_within_its_budget() -> None:
    turns = [_turn(i, f"question {i} " + "x" * 200, f"answer {i}") for i in range(1, 6)]
    source = ContextInput(MODEL, "sys", "now?", history=turns, history_token_budget=150)

    contents = [m["content"] for m in assemble_context(source).messages]

    assert contents[-1] == "now?"
    assert "answer 5" in contents and "answer 1" not in contents
    assert contents[1].startswith("question ")  # whole turns only


def test_business_keys_may_not_be_messages() -> None:
    with pytest.raises(StateError, match="messages"):
        assemble_context(ContextInput(MODEL, "sys", "hi", business={"messages": []}))


def test_the_run_started_event_says_where_the_context_tokens_came_from() -> None:
    store = InMemoryRunStore()
    store.create("r", assemble_context(ContextInput(MODEL, "sys", "hi", history=[_turn(1, "a", "b")])))
    runtime = build_runtime(parse_policy({}), AgentConfig(MODEL, "sys"))
    runtime.loop(ScriptedModel([say("ok")]), FunctionToolExecutor({}), store).run("r")
    started = next(e for e in store.events("r") if e["type"] == "run.started")["payload"]
    assert started["context_tokens"] > 0 and started["context"][2]["name"] == "history"


def test_the_default_policy_is_valid_and_parses_an_empty_document() -> None:
    assert check_policy(DEFAULT_POLICY) == []
    assert parse_policy({}).document == DEFAULT_POLICY


def test_policy_errors_name_the_path_the_problem_and_the_expectation() -> None:
    bad = {
        "limits": {"model_calls": {"run_limit": -1, "exit_behavior": "explode"}, "tiers": {"enabled": True}},
        "budgets": {"run": {"cost": "cheap"}},
        "loop_detection": {"max_repeats": 1, "surprise": True},
        "context": {"compression": {"window_share": 1.5, "identifier_patterns": ["("]}},
    }
    with pytest.raises(PolicyError) as info:
        parse_policy(bad)
    errors = info.value.errors
    assert "limits.model_calls.run_limit: must be a positive integer or null, got -1" in errors
    assert "limits.model_calls.exit_behavior: must be one of ['end', 'error'], got 'explode'" in errors
    assert any(e.startswith("limits.tiers.table: must list at least one tier") for e in errors)
    assert "budgets.run.cost: must be a number above 0 or null, got 'cheap'" in errors
    assert any(e.startswith("loop_detection.max_repeats: must be an integer >= 2") for e in errors)
    assert any(e.startswith("loop_detection.surprise: unknown field") for e in errors)
    assert any(e.startswith("context.compression.window_share: must be a number above 0 and at most 1.0") for e in errors)
    assert any(e.startswith("context.compression.identifier_patterns[0]: is not a valid regular expression") for e in errors)
    assert len(errors) == 8, errors  # all reported at once


def test_a_check_across_fields_runs_once_the_fields_it_relates_are_valid() -> None:
    # A section's own fields are checked first; a rule relating two of them needs both to be well-formed.
    assert check_policy({"budgets": {"run": {"tokens": 10, "cost": "cheap"}}}) == [
        "budgets.run.cost: must be a number above 0 or null, got 'cheap'"]
    assert check_policy({"budgets": {"run": {"tokens": 10}}}) == [
        "budgets.run.tokens: must be at least budgets.max_output_tokens (1024) or no call fits, got 10"]


def test_summarization_threshold_must_sit_below_the_editing_trigger() -> None:
    policy = {
        "context": {
            "summarization": {"enabled": True, "token_threshold": 8000},
            "editing": {"enabled": True, "trigger": 6000, "keep": 3000},
        }
    }
    with pytest.raises(PolicyError, match=r"context.summarization.token_threshold: must be below context.editing.trigger \(6000\)"):
        parse_policy(policy)
    policy["context"]["summarization"]["token_threshold"] = 4000
    parse_policy(policy)


def test_summarization_threshold_must_sit_below_compression_when_the_window_is_known() -> None:
    policy = {"context": {"context_window": 8000, "summarization": {"enabled": True, "token_threshold": 6000}}}
    with pytest.raises(PolicyError, match="compression's threshold \\(5600"):
        parse_policy(policy)


def test_a_policy_that_is_not_an_object_is_refused() -> None:
    assert check_policy([1, 2]) == ["policy: must be a JSON object, got list"]
    assert check_policy({"limits": 3}) == ["limits: must be an object, got 3"]


def test_build_runtime_maps_the_policy_onto_the_loop() -> None:
    policy = parse_policy(
        {
            "limits": {"max_recursion": 4, "tiers": {"enabled": True, "table": {"free": 3, "vip": 10}}},
            "budgets": {"max_output_tokens": 256},
            "approvals": {"stop_on_rejection": False},
            "hooks": [{"name": "tag", "kind": "set_state", "position": "before_agent", "values": {"x": 1}}],
        }
    )
    runtime = build_runtime(policy, AgentConfig(MODEL, "sys", context_window=32000))

    assert runtime.config.max_recursion == 4 and runtime.config.max_output_tokens == 256
    assert runtime.config.stop_on_rejection is False and runtime.config.context_window == 32000
    assert [type(h) for h in runtime.hooks[:3]] == [ModelCallLimit, TierLimit, LoopDetection]
    assert [h.name for h in runtime.hooks] == ["model_call_limit", "tier_limit", "loop_detection", "tag"]


def test_a_rejection_can_be_read_by_the_model_instead_of_ending_the_run() -> None:
    from runtime.scripted import call

    store = InMemoryRunStore()
    store.create("r", assemble_context(ContextInput(MODEL, "sys", "book it")))
    runtime = build_runtime(parse_policy({"approvals": {"stop_on_rejection": False}}), AgentConfig(MODEL, "sys"))
    executor = FunctionToolExecutor({"book": lambda a: "ok"}, needs_approval=frozenset({"book"}))
    model = ScriptedModel([call("book", {}, call_id="c1"), say("I could not book it.")])
    loop = runtime.loop(model, executor, store)
    loop.run("r")
    executor.decisions["c1"] = "rejected"
    assert loop.run("r").terminal_reason == TerminalReason.FINAL_ANSWER
