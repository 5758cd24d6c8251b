"""What the API returns, as dataclasses. Each keeps the whole JSON object in ``raw`` (fields added later are there)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qs, urlsplit

T = TypeVar("T")

#: A run's statuses that will not change again.
TERMINAL_STATUSES = frozenset({"finished"})


@dataclass(frozen=True)
class Run:
    id: str
    status: str
    agent: str
    input: str
    output: str | None
    error: str | None
    session: str | None
    version: int | None
    terminal_reason: str | None
    step: int
    last_seq: int
    created_at: str
    finished_at: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        return cls(
            id=str(data["id"]), status=str(data["status"]), agent=str(data.get("agent", "")), input=str(data.get("input", "")),
            output=data.get("output"), error=data.get("error"), session=data.get("session"), version=data.get("version"),
            terminal_reason=data.get("terminal_reason"), step=int(data.get("step") or 0), last_seq=int(data.get("last_seq") or 0),
            created_at=str(data.get("created_at", "")), finished_at=data.get("finished_at"), raw=data,
        )

    @property
    def done(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class Session:
    id: str
    agent: str
    created_at: str
    updated_at: str
    turn_count: int
    run_count: int
    erased: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Session:
        return cls(
            id=str(data["id"]), agent=str(data.get("agent", "")), created_at=str(data.get("created_at", "")),
            updated_at=str(data.get("updated_at", "")), turn_count=int(data.get("turn_count") or 0),
            run_count=int(data.get("run_count") or 0), erased=bool(data.get("erased")), raw=data,
        )


@dataclass(frozen=True)
class Decision:
    user: str | None
    approved: bool
    note: str
    at: str


@dataclass(frozen=True)
class Approval:
    id: str
    status: str
    tool_name: str
    agent: str
    run: str
    step: int
    call_id: str
    question: str
    preview: Any
    arguments_hash: str
    required_approvals: int
    requested_at: str
    expires_at: str | None
    decided_at: str | None
    decisions: list[Decision]
    raw: dict[str, Any] = field(repr=False, compare=False)
    #: The hash of the arguments an approver edited (empty when nobody did); what runs if approved.
    edited_hash: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Approval:
        return cls(
            id=str(data["id"]), status=str(data["status"]), tool_name=str(data.get("tool_name", "")), agent=str(data.get("agent", "")),
            run=str(data.get("run", "")), step=int(data.get("step") or 0), call_id=str(data.get("call_id", "")),
            question=str(data.get("question", "")), preview=data.get("preview"), arguments_hash=str(data.get("arguments_hash", "")),
            required_approvals=int(data.get("required_approvals") or 1), requested_at=str(data.get("requested_at", "")),
            expires_at=data.get("expires_at"), decided_at=data.get("decided_at"),
            decisions=[Decision(d.get("user"), bool(d.get("approved")), str(d.get("note", "")), str(d.get("at", "")))
                       for d in data.get("decisions") or []],
            raw=data, edited_hash=str(data.get("edited_hash") or ""),
        )


@dataclass(frozen=True)
class Page(Generic[T]):
    """One cursor page of a list; pass ``next_cursor`` as ``cursor=`` for the next one (``None``: the last page)."""

    items: list[T]
    next_cursor: str | None


def page_of(data: dict[str, Any], parse: Any) -> Page[Any]:
    next_url = data.get("next")
    cursor = parse_qs(urlsplit(next_url).query).get("cursor", [None])[0] if next_url else None
    return Page(items=[parse(item) for item in data.get("results") or []], next_cursor=cursor)


@dataclass(frozen=True)
class StreamEvent:
    """One frame of a run's stream. ``seq`` is set for committed trace events (their SSE id), ``None`` for
    ``message.delta`` frames (the model's text as it streams: ``text``, ``step``, ``offset``, ``attempt``)."""

    type: str
    seq: int | None
    data: dict[str, Any]

    @property
    def is_delta(self) -> bool:
        return self.type == "message.delta"

    @property
    def text(self) -> str:
        return str(self.data.get("text", "")) if self.is_delta else ""


@dataclass(frozen=True)
class RetryNotice:
    """Given to ``on_retry`` before the client waits: why (``status`` 429/503, or ``reconnect`` of a stream), how long."""

    reason: str
    attempt: int
    delay: float
    method: str
    url: str
    status: int | None = None
    retry_after: float | None = None
    last_seq: int | None = None
