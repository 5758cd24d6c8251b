"""Plain data the runtime passes around. All of it is JSON-serialisable."""

from __future__ import annotations

import copy
import json
import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

#: A chat message in the OpenAI Chat Completions shape:
#: ``{"role": "system"|"user"|"assistant"|"tool", "content": str|None, ...}``.
Message = dict[str, Any]


_ATOMS = (str, int, float, bool, type(None))


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, strings, numbers, booleans, None), three times faster than
    ``copy.deepcopy`` on a model request; anything else inside is handed to ``copy.deepcopy``."""
    kind = type(value)
    if kind is dict:
        return {key: copy_json(item) for key, item in value.items()}
    if kind is list:
        return [copy_json(item) for item in value]
    if kind in _ATOMS:
        return value
    return copy.deepcopy(value)


def new_span_id() -> str:
    return uuid.uuid4().hex[:16]


class Phase(StrEnum):
    PLANNING = "planning"
    ACTING = "acting"
    WAITING = "waiting"
    OBSERVING = "observing"
    FINISHED = "finished"


class TerminalReason(StrEnum):
    FINAL_ANSWER = "final_answer"
    LIMIT_REACHED = "limit_reached"
    BUDGET_EXCEEDED = "budget_exceeded"
    LOOP_DETECTED = "loop_detected"
    MAX_RECURSION = "max_recursion"
    TIMEOUT = "timeout"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @cached_property
    def openai_json(self) -> str:
        """``to_openai()`` as ``json.dumps`` writes it, made once per spec: a step counts its tools' tokens several times
        (compaction, the budget's projection, usage), and making this text was most of each count."""
        return json.dumps(self.to_openai(), ensure_ascii=False)


@dataclass(frozen=True)
class ToolCall:
    """A tool call as the model asked for it. ``arguments`` is the raw text (it may be broken JSON)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            round(self.cost + other.cost, 10),
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens, "cost": self.cost}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Usage:
        data = data or {}
        return cls(int(data.get("input_tokens", 0)), int(data.get("output_tokens", 0)), float(data.get("cost", 0.0)))


@dataclass
class ModelRequest:
    model: str
    messages: list[Message]
    tools: list[ToolSpec]
    task: str = "act"
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Upper bound on the reply's tokens; budgets assume the reply may use all of it.
    max_output_tokens: int | None = None

    def private_copy(self) -> ModelRequest:
        """A copy sharing nothing mutable with this request (what the interceptors are handed)."""
        return ModelRequest(
            model=self.model,
            messages=[copy_json(message) for message in self.messages],
            tools=[ToolSpec(t.name, t.description, copy_json(t.parameters)) if type(t) is ToolSpec else copy.deepcopy(t)
                   for t in self.tools],
            task=self.task,
            metadata=copy_json(self.metadata),
            max_output_tokens=self.max_output_tokens,
        )


@dataclass
class ModelResponse:
    """The assistant's reply. ``trace`` holds extra span payloads (attempts, plans) for the run's trace."""

    content: str | None
    tool_calls: list[ToolCall]
    usage: Usage
    model: str
    finish_reason: str = "stop"
    trace: list[dict[str, Any]] = field(default_factory=list)

    def as_message(self) -> Message:
        message: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return message


class ToolStatus(StrEnum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    DENIED = "denied"
    INVALID = "invalid"
    DUPLICATE_BLOCKED = "duplicate_blocked"
    PENDING_APPROVAL = "pending_approval"
    REJECTED = "rejected"
    EGRESS_DENIED = "egress_denied"
    OUTCOME_UNKNOWN = "outcome_unknown"
    RATE_LIMITED = "rate_limited"


@dataclass(frozen=True)
class ToolContext:
    run_id: str
    step: int
    span_id: str
    #: The call's identity on every attempt when the caller has one that the run's step counter is not: a flow node's
    #: call id (``fl:<run>:<node>``, a map item's index in its node id), whose run moves on between the node's
    #: attempts. The write ledger finds an earlier attempt by it and the idempotency key derives from it. Empty: the
    #: step is the identity (an agent step is run again under its number until it commits).
    call_key: str = ""


@dataclass
class ToolOutcome:
    """The result of one tool call. ``content`` is what the model reads next."""

    call_id: str
    status: ToolStatus
    content: str
    trace: list[dict[str, Any]] = field(default_factory=list)

    @property
    def pending(self) -> bool:
        return self.status == ToolStatus.PENDING_APPROVAL


@dataclass
class Event:
    """One entry of a run's trace. The store gives it its per-run ``seq`` when it commits."""

    type: str
    payload: dict[str, Any]
    span_id: str = field(default_factory=new_span_id)
    parent_span_id: str | None = None
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "payload": self.payload,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "at": self.at,
        }
