"""What one step accumulates before its single commit, and the stop signal used inside a step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.budgets import Stop
from runtime.protocols import Checkpoint
from runtime.types import Event, Message, Phase, TerminalReason, new_span_id


class StopRun(Exception):
    """Raised inside a step to end the run; carries the one terminal decision."""

    def __init__(self, stop: Stop) -> None:
        super().__init__(stop.reason)
        self.stop = stop


class StepBuffer:
    """Accumulates what one step will commit: messages, state, usage, events, pending calls."""

    def __init__(self, checkpoint: Checkpoint, root_span: str) -> None:
        self.number = checkpoint.step + 1
        self.phase = checkpoint.phase
        self.root_span = root_span
        self.state: dict[str, Any] = dict(checkpoint.state)
        self.usage = checkpoint.usage
        self.events: list[Event] = []
        self.appended: list[Message] = []
        self.pending: list[dict[str, Any]] = []
        self.terminal_reason: TerminalReason | None = None
        self.output: str | None = None

    @property
    def finished(self) -> bool:
        return self.terminal_reason is not None

    def emit(self, type_: str, payload: dict[str, Any], *, span_id: str | None = None, parent: str | None = None) -> Event:
        parent_span = self.root_span if parent is None else (parent or None)
        event = Event(type_, payload, span_id=span_id or new_span_id(), parent_span_id=parent_span)
        self.events.append(event)
        return event

    def transition(self, to: Phase, reason: str) -> None:
        self.emit("state.transition", {"from": self.phase.value, "to": to.value, "reason": reason, "step": self.number})
        self.phase = to


def open_call_stubs(log: Sequence[Message], reason: str) -> list[Message]:
    """Tool messages for calls of the last assistant turn that never got a result.

    A run that stops between a ``tool_calls`` message and its results would leave a conversation
    that providers reject on the session's next turn; each open call gets an explicit answer.
    """
    for index in range(len(log) - 1, -1, -1):
        message = log[index]
        if message.get("role") == "assistant" and message.get("tool_calls"):
            answered = {m.get("tool_call_id") for m in log[index + 1 :] if m.get("role") == "tool"}
            return [
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "name": call.get("function", {}).get("name", ""),
                    "content": f"Not executed: the run stopped before this call ({reason}).",
                }
                for call in message["tool_calls"]
                if call["id"] not in answered
            ]
        if message.get("role") in {"user", "system"}:
            return []
    return []
