"""JSON round-trips for checkpoints and step records (what a store persists)."""

from __future__ import annotations

import json
from typing import Any

from runtime.protocols import Checkpoint, StepRecord
from runtime.types import Event, Phase, TerminalReason, Usage

NUL = "\x00"
REPLACEMENT = "\ufffd"


def without_nul(value: Any) -> Any:
    """``value`` with every NUL character in its strings and keys replaced by U+FFFD (nothing else changed).

    PostgreSQL's text and jsonb cannot hold ``\\x00``, so text from outside a run (a tool's answer or error, the
    model's reply, its tool arguments) passes through here where it enters; the rest of the text is kept.
    """
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT) if NUL in value else value
    if isinstance(value, dict):
        return {without_nul(k) if isinstance(k, str) else k: without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(without_nul(v) for v in value)
    return value


def checkpoint_to_dict(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "step": checkpoint.step,
        "phase": checkpoint.phase.value,
        "messages": checkpoint.messages,
        "state": checkpoint.state,
        "usage": checkpoint.usage.to_dict(),
        "pending_calls": checkpoint.pending_calls,
        "started_at": checkpoint.started_at,
        "cancel_requested": checkpoint.cancel_requested,
    }


def checkpoint_from_dict(data: dict[str, Any]) -> Checkpoint:
    return Checkpoint(
        step=int(data.get("step", 0)),
        phase=Phase(data.get("phase", Phase.PLANNING.value)),
        messages=list(data.get("messages", [])),
        state=dict(data.get("state", {})),
        usage=Usage.from_dict(data.get("usage")),
        pending_calls=list(data.get("pending_calls", [])),
        started_at=data.get("started_at"),
        cancel_requested=bool(data.get("cancel_requested", False)),
    )


def checkpoint_to_json(checkpoint: Checkpoint) -> str:
    return json.dumps(checkpoint_to_dict(checkpoint), ensure_ascii=False, allow_nan=False)


def checkpoint_from_json(text: str) -> Checkpoint:
    return checkpoint_from_dict(json.loads(text))


def record_to_dict(record: StepRecord) -> dict[str, Any]:
    return {
        "step": record.step,
        "phase": record.phase.value,
        "appended_messages": record.appended_messages,
        "state": record.state,
        "usage": record.usage.to_dict(),
        "events": [e.to_dict() for e in record.events],
        "pending_calls": record.pending_calls,
        "terminal_reason": record.terminal_reason.value if record.terminal_reason else None,
        "output": record.output,
    }


def record_from_dict(data: dict[str, Any]) -> StepRecord:
    return StepRecord(
        step=int(data["step"]),
        phase=Phase(data["phase"]),
        appended_messages=list(data["appended_messages"]),
        state=dict(data["state"]),
        usage=Usage.from_dict(data["usage"]),
        events=[
            Event(e["type"], e["payload"], span_id=e["span_id"], parent_span_id=e["parent_span_id"], at=e["at"]) for e in data["events"]
        ],
        pending_calls=list(data.get("pending_calls", [])),
        terminal_reason=TerminalReason(data["terminal_reason"]) if data.get("terminal_reason") else None,
        output=data.get("output"),
    )
