"""The seams between the pure core and the world. The Django layer implements these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.types import (
    Event,
    Message,
    ModelRequest,
    ModelResponse,
    Phase,
    TerminalReason,
    ToolCall,
    ToolContext,
    ToolOutcome,
    Usage,
)


class ModelClient(Protocol):
    def complete(self, request: ModelRequest) -> ModelResponse: ...


class ToolExecutor(Protocol):
    def execute(self, call: ToolCall, ctx: ToolContext) -> ToolOutcome: ...


class PendingTool(Protocol):
    """A call an executor began (``start``): its outcome comes from ``result``, once."""

    def settled(self) -> ToolOutcome | None:
        """The outcome when the call was decided without running (refused, or waiting for an approval); else None."""
        ...

    def result(self) -> ToolOutcome: ...


class StartsTools(Protocol):
    """A :class:`ToolExecutor` that can also begin a call and answer for it later, so that the calls of one model
    turn run side by side (the Django layer's tool gateway does)."""

    def start(self, call: ToolCall, ctx: ToolContext) -> PendingTool: ...


@dataclass
class Checkpoint:
    """Everything needed to resume a run at a step boundary.

    ``messages`` is the full conversation the model sees; stores persist it as an
    append-only log (``StepRecord.appended_messages``), never re-saving it whole.
    """

    step: int = 0
    phase: Phase = Phase.PLANNING
    messages: list[Message] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    pending_calls: list[dict[str, Any]] = field(default_factory=list)
    started_at: float | None = None
    #: Set by the store when an operator cancelled the run (e.g. while it was WAITING); the next
    #: step then ends the run as ``cancelled`` without calling the model or a tool.
    cancel_requested: bool = False


@dataclass
class StepRecord:
    """What one step commits, atomically: new messages, the small business state, events, status."""

    step: int
    phase: Phase
    appended_messages: list[Message]
    state: dict[str, Any]
    usage: Usage
    events: list[Event]
    pending_calls: list[dict[str, Any]] = field(default_factory=list)
    terminal_reason: TerminalReason | None = None
    output: str | None = None


@dataclass(frozen=True)
class StepAck:
    """The store's answer to a commit: whether the run should stop at this boundary."""

    cancel_requested: bool = False
    lease_lost: bool = False


class RunStore(Protocol):
    def load(self, run_id: str) -> Checkpoint: ...

    def commit_step(self, run_id: str, record: StepRecord) -> StepAck: ...


class EventSink(Protocol):
    """Receives events after their step committed (for live delivery)."""

    def publish(self, run_id: str, events: list[Event]) -> None: ...
