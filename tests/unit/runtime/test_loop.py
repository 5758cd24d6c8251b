"""The loop's state machine, stop layers, commits, resume, approval pause and cancel."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.memory import DuplicateStepError, InMemoryRunStore
from runtime.protocols import StepAck, StepRecord
from runtime.scripted import call, say
from runtime.types import Phase, TerminalReason
from tests.unit.runtime.helpers import harness


def _transitions(h: Any) -> list[tuple[str, str]]:
    return [(e["payload"]["from"], e["payload"]["to"]) for e in h.events("state.transition")]


def test_model_answers_without_tools_ends_as_final_answer() -> None:
    h = harness([say("CA1234 is on time.")])

    result = h.run()

    assert result.terminal_reason == TerminalReason.FINAL_ANSWER
    assert result.output == "CA1234 is on time."
    assert h.terminal_reasons() == [TerminalReason.FINAL_ANSWER]
    assert [r.step for r in h.records()] == [1]
    finished = h.events("run.finished")
    assert len(finished) == 1 and finished[0]["payload"]["terminal_reason"] == "final_answer"


def test_a_tool_round_goes_planning_acting_observing_then_finished() -> None:
    h = harness([call("lookup", {"flight": "CA1234"}), say("On time.")])

    result = h.run()

    assert result.terminal_reason == TerminalReason.FINAL_ANSWER
    assert _transitions(h) == [
        ("planning", "acting"),
        ("acting", "observing"),
        ("observing", "planning"),
        ("planning", "finished"),
    ]
    assert [r.step for r in h.records()] == [1, 2]
    roles = [m["role"] for m in h.messages()]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]


def test_model_call_events_carry_tokens_cost_latency_and_finish_reason() -> None:
    h = harness([say("hi")])
    h.run()

    (event,) = h.events("model.call")
    for key in ("input_tokens", "output_tokens", "cost", "latency_ms", "finish_reason", "estimated_input_tokens"):
        assert key in event["payload"]


def test_every_event_is_in_exactly_one_step_record() -> None:
    h = harness([call("lookup", {"a": 1}), say("done")])
    h.run()

    committed = [e for r in h.records() for e in r.events]
    assert len(committed) == len(h.events())
    assert [e["seq"] for e in h.events()] == list(range(1, len(committed) + 1))


def test_hard_max_recursion_ends_with_a_clear_reason() -> None:
    replies = [call("lookup", {"n": i}) for i in range(10)]
    h = harness(replies, policy={"limits": {"max_recursion": 3, "model_calls": {"run_limit": None}}})

    result = h.run()

    assert result.terminal_reason == TerminalReason.MAX_RECURSION
    assert "3 steps" in (result.output or "")
    assert h.terminal_reasons() == [TerminalReason.MAX_RECURSION]
    assert "max_recursion" in h.events("run.finished")[0]["payload"]["reason"]


def test_model_failure_ends_as_error() -> None:
    def broken(_: Any) -> Any:
        raise ConnectionError("provider unreachable after retry and failover")

    h = harness([broken])
    result = h.run()

    assert result.terminal_reason == TerminalReason.ERROR
    assert "provider unreachable" in h.events("run.finished")[0]["payload"]["reason"]
    assert len(h.events("model.error")) == 1


class CrashingStore(InMemoryRunStore):
    """Simulates a worker dying while committing a given step (nothing of that step is durable)."""

    def __init__(self, crash_at: int) -> None:
        super().__init__()
        self.crash_at = crash_at

    def commit_step(self, run_id: str, record: StepRecord) -> StepAck:
        if record.step == self.crash_at:
            self.crash_at = -1
            raise SystemExit("worker died")
        return super().commit_step(run_id, record)


def test_resume_after_a_crash_continues_without_duplicating_a_step() -> None:
    store = CrashingStore(crash_at=3)
    replies = [call("lookup", {"n": 1}), call("lookup", {"n": 2}), call("lookup", {"n": 3}), say("done")]
    h = harness(replies, store=store)

    with pytest.raises(SystemExit):
        h.run()
    assert [r.step for r in h.records()] == [1, 2]
    assert h.store.load("run-1").step == 2

    # the redelivered task: a new loop process, the model replays step 3's call
    h.model.requests.pop()  # the lost step's model call will be made again
    result = h.run()

    assert result.terminal_reason == TerminalReason.FINAL_ANSWER
    assert [r.step for r in h.records()] == [1, 2, 3, 4]
    messages = h.messages()
    assert [m["role"] for m in messages].count("system") == 1  # the initial context was persisted once
    call_ids = [c["id"] for m in messages for c in m.get("tool_calls", [])]
    assert len(call_ids) == len(set(call_ids)) == 3
    assert h.terminal_reasons() == [TerminalReason.FINAL_ANSWER]


def test_a_store_refuses_a_step_number_twice() -> None:
    h = harness([say("hi")])
    h.run()
    record = h.records()[0]
    with pytest.raises(DuplicateStepError):
        h.store.commit_step("run-1", record)


def test_approval_pauses_in_waiting_and_resumes_with_the_decision() -> None:
    h = harness(
        [call("book", {"flight": "CA1234"}, call_id="c1"), say("Booked.")],
        functions={"book": lambda a: "booking ref BK-12345"},
        needs_approval=frozenset({"book"}),
    )

    paused = h.run()
    assert paused.phase == Phase.WAITING and paused.terminal_reason is None
    checkpoint = h.store.load("run-1")
    assert checkpoint.phase == Phase.WAITING
    assert checkpoint.pending_calls == [{"id": "c1", "name": "book", "arguments": '{"flight": "CA1234"}'}]
    assert h.executor.calls == []

    h.executor.decisions["c1"] = "approved"
    result = h.run()

    assert result.terminal_reason == TerminalReason.FINAL_ANSWER
    assert [r.step for r in h.records()] == [1, 2, 3]  # the resume is its own step
    assert ("waiting", "acting") in _transitions(h)
    assert [c.name for c in h.executor.calls] == ["book"]
    tool_messages = [m for m in h.messages() if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["booking ref BK-12345"]


def test_a_rejected_call_ends_the_run_as_rejected_when_the_policy_says_so() -> None:
    h = harness(
        [call("book", {"flight": "CA1234"}, call_id="c1")],
        functions={"book": lambda a: "booked"},
        needs_approval=frozenset({"book"}),
        policy={"approvals": {"stop_on_rejection": True}},
    )
    h.run()
    h.executor.decisions["c1"] = "rejected"

    result = h.run()

    assert result.terminal_reason == TerminalReason.REJECTED
    assert "not approved" in (result.output or "")
    assert h.terminal_reasons() == [TerminalReason.REJECTED]


def test_by_default_a_rejection_is_read_by_the_model_which_goes_on() -> None:
    h = harness(
        [call("book", {"flight": "CA1234"}, call_id="c1"), say("The change was not approved, so I did not rebook.")],
        functions={"book": lambda a: "booked"},
        needs_approval=frozenset({"book"}),
    )
    h.run()
    h.executor.decisions["c1"] = "rejected"

    result = h.run()

    assert result.terminal_reason == TerminalReason.FINAL_ANSWER
    tool_messages = [m for m in h.store.load("run-1").messages if m.get("role") == "tool"]
    assert "rejected" in tool_messages[-1]["content"].lower()


def test_cancel_requested_at_a_commit_ends_the_run_as_cancelled() -> None:
    replies = [call("lookup", {"n": i}) for i in range(5)]
    h = harness(replies)

    original = h.store.commit_step

    def commit_and_cancel(run_id: str, record: StepRecord) -> StepAck:
        ack = original(run_id, record)
        if record.step == 2:
            h.store.request_cancel(run_id)
            return StepAck(cancel_requested=True)
        return ack

    h.store.commit_step = commit_and_cancel  # type: ignore[method-assign]
    result = h.run()

    assert result.terminal_reason == TerminalReason.CANCELLED
    assert [r.step for r in h.records()] == [1, 2, 3]
    assert len(h.model.requests) == 2
    assert h.terminal_reasons() == [TerminalReason.CANCELLED]


def test_cancel_while_waiting_ends_the_run_and_answers_the_pending_call() -> None:
    h = harness(
        [call("book", {"flight": "CA1234"}, call_id="c1")],
        functions={"book": lambda a: "booked"},
        needs_approval=frozenset({"book"}),
    )
    h.run()
    h.store.request_cancel("run-1")

    result = h.run()

    assert result.terminal_reason == TerminalReason.CANCELLED
    assert h.executor.calls == []
    stub = [m for m in h.messages() if m["role"] == "tool"]
    assert stub and stub[0]["tool_call_id"] == "c1" and "Not executed" in stub[0]["content"]


def test_running_a_finished_run_again_does_nothing() -> None:
    h = harness([say("hi")])
    h.run()
    again = h.run()
    assert again.terminal_reason == TerminalReason.FINAL_ANSWER
    assert len(h.records()) == 1


@pytest.mark.parametrize(
    ("replies", "policy", "expected"),
    [
        ([say("hi")], {}, TerminalReason.FINAL_ANSWER),
        ([call("lookup", {"n": i}) for i in range(9)], {"limits": {"model_calls": {"run_limit": 2}}}, "limit_reached"),
        ([call("lookup", {"n": 1})] * 4, {}, TerminalReason.LOOP_DETECTED),
        ([call("lookup", {"n": i}) for i in range(9)], {"limits": {"max_recursion": 2}}, "max_recursion"),
        ([say("hi")], {"budgets": {"max_output_tokens": 10, "run": {"tokens": 12}}}, "budget_exceeded"),
    ],
)
def test_every_run_ends_with_exactly_one_terminal_reason(replies: Any, policy: Any, expected: str) -> None:
    h = harness(replies, policy=policy)

    result = h.run()

    assert result.terminal_reason == expected
    assert h.terminal_reasons() == [expected]
    assert h.records()[-1].terminal_reason == expected  # and it is the last step
    assert len(h.events("run.finished")) == 1
    assert h.state()["_terminal_reason"] == expected


def test_an_unexpected_exception_in_custom_code_ends_the_run_as_error_and_is_committed() -> None:
    def broken_interceptor(request: Any, call_next: Any) -> Any:
        raise ValueError("bug in custom code")

    h = harness([say("x")], model_interceptors=[broken_interceptor])
    result = h.run()
    assert result.terminal_reason == TerminalReason.ERROR
    assert "bug in custom code" in h.events("run.finished")[0]["payload"]["reason"]
