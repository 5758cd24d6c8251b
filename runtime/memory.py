"""In-memory implementations of the runtime's seams, for tests and benchmarks.

``InMemoryRunStore`` behaves like the database store: it persists each step as JSON (so anything
that is not JSON fails loudly), rebuilds a checkpoint from the append-only message log, gives each
event its per-run ``seq``, refuses a step number it has already seen, and answers commits with
cancel requests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.protocols import Checkpoint, StepAck, StepRecord
from runtime.serde import checkpoint_from_json, checkpoint_to_json, record_from_dict, record_to_dict
from runtime.types import Event, Phase, ToolCall, ToolContext, ToolOutcome, ToolStatus


class DuplicateStepError(RuntimeError):
    pass


class InMemoryRunStore:
    def __init__(self) -> None:
        self._initial: dict[str, str] = {}
        self._records: dict[str, list[str]] = {}
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._cancel: set[str] = set()

    def create(self, run_id: str, checkpoint: Checkpoint) -> None:
        self._initial[run_id] = checkpoint_to_json(checkpoint)
        self._records[run_id] = []
        self._events[run_id] = []

    def request_cancel(self, run_id: str) -> None:
        self._cancel.add(run_id)

    def records(self, run_id: str) -> list[StepRecord]:
        return [record_from_dict(json.loads(r)) for r in self._records[run_id]]

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return [dict(e) for e in self._events[run_id]]

    def load(self, run_id: str) -> Checkpoint:
        checkpoint = checkpoint_from_json(self._initial[run_id])
        records = self.records(run_id)
        if not records:
            checkpoint.cancel_requested = run_id in self._cancel
            return checkpoint
        checkpoint.messages = [m for r in records for m in r.appended_messages]  # step 1 carries the initial context
        last = records[-1]
        checkpoint.step = last.step
        checkpoint.phase = last.phase
        checkpoint.state = last.state
        checkpoint.usage = last.usage
        checkpoint.pending_calls = last.pending_calls
        checkpoint.cancel_requested = run_id in self._cancel and last.phase != Phase.FINISHED
        return checkpoint

    def commit_step(self, run_id: str, record: StepRecord) -> StepAck:
        done = self._records[run_id]
        expected = len(done) + 1
        if record.step != expected:
            raise DuplicateStepError(f"run {run_id}: step {record.step} committed, expected step {expected}")
        if done and json.loads(done[-1])["phase"] == Phase.FINISHED.value:
            raise DuplicateStepError(f"run {run_id} already finished; step {record.step} refused")
        done.append(json.dumps(record_to_dict(record), ensure_ascii=False, allow_nan=False))
        log = self._events[run_id]
        for event in record.events:
            log.append({"seq": len(log) + 1, "step": record.step, **event.to_dict()})
        return StepAck(cancel_requested=run_id in self._cancel)


@dataclass
class InMemoryEventSink:
    published: list[tuple[str, Event]] = field(default_factory=list)

    def publish(self, run_id: str, events: list[Event]) -> None:
        self.published.extend((run_id, e) for e in events)


ToolFunction = Callable[[dict[str, Any]], str | ToolOutcome]


@dataclass
class FunctionToolExecutor:
    """Runs plain functions by tool name. Tools in ``needs_approval`` return PENDING_APPROVAL until
    ``decisions[call_id]`` is ``"approved"`` or ``"rejected"``. A function that raises is an ERROR."""

    functions: Mapping[str, ToolFunction]
    needs_approval: frozenset[str] = frozenset()
    decisions: dict[str, str] = field(default_factory=dict)
    calls: list[ToolCall] = field(default_factory=list)

    def execute(self, call: ToolCall, ctx: ToolContext) -> ToolOutcome:
        if call.name in self.needs_approval:
            decision = self.decisions.get(call.id)
            if decision is None:
                return ToolOutcome(call.id, ToolStatus.PENDING_APPROVAL, "Waiting for approval.")
            if decision != "approved":
                return ToolOutcome(call.id, ToolStatus.REJECTED, f"An approver rejected the call to {call.name}.")
        self.calls.append(call)
        function = self.functions.get(call.name)
        if function is None:
            return ToolOutcome(call.id, ToolStatus.DENIED, f"Unknown tool {call.name!r}.")
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            return ToolOutcome(call.id, ToolStatus.INVALID, "Arguments must be a JSON object.")
        try:
            result = function(arguments)
        except Exception as exc:
            return ToolOutcome(call.id, ToolStatus.ERROR, f"{call.name} failed: {exc}")
        return result if isinstance(result, ToolOutcome) else ToolOutcome(call.id, ToolStatus.OK, result)
