"""Context contributors: an ordered chain that assembles a run's initial checkpoint.

The Django side gathers plain data (:class:`ContextInput`) and calls :func:`assemble_context`.
The default chain, in order:

1. ``system_prompt``  the agent version's prompt (a system message; never condensed later);
2. ``facts``          tenant and user facts, as a second system message (what the model may know);
3. ``history``        the session's earlier turns, oldest first by ``turn_seq``; whole turns only,
                      the most recent that fit ``history_token_budget`` (a turn's tool calls stay
                      with their results);
4. ``user_message``   the new question;
5. ``business_keys``  the client's business keys and the session counters go into the *state*,
                      never into the messages.

Each contributor's token count lands in ``state["_assembly"]`` and in the ``run.started`` event,
so an operator can see where a 7,000-token context came from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.protocols import Checkpoint
from runtime.state import ASSEMBLY, SESSION_MODEL_CALLS, SESSION_USAGE, USER_TIER, check_writable_key
from runtime.tokens import count_messages
from runtime.types import Message


@dataclass(frozen=True)
class Turn:
    """One earlier turn of the session: its sequence number and its messages (OpenAI shape)."""

    turn_seq: int
    messages: Sequence[Message]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Turn:
        return cls(int(data["turn_seq"]), list(data.get("messages", [])))


@dataclass(frozen=True)
class ContextInput:
    model: str
    system_prompt: str
    user_message: str
    history: Sequence[Turn] = ()
    tenant_facts: Mapping[str, Any] = field(default_factory=dict)
    user_facts: Mapping[str, Any] = field(default_factory=dict)
    business: Mapping[str, Any] = field(default_factory=dict)
    user_tier: str | None = None
    session_model_calls: int = 0
    session_usage: Mapping[str, Any] = field(default_factory=dict)
    history_token_budget: int | None = None


@dataclass
class ContextDraft:
    messages: list[Message] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)


class ContextContributor(Protocol):
    @property
    def name(self) -> str: ...

    def contribute(self, source: ContextInput, draft: ContextDraft) -> None: ...


@dataclass(frozen=True)
class SystemPrompt:
    name: str = "system_prompt"

    def contribute(self, source: ContextInput, draft: ContextDraft) -> None:
        if source.system_prompt:
            draft.messages.append({"role": "system", "content": source.system_prompt})


def _facts_text(title: str, facts: Mapping[str, Any]) -> str:
    lines = [f"- {k}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}" for k, v in facts.items()]
    return f"{title}:\n" + "\n".join(lines)


@dataclass(frozen=True)
class Facts:
    name: str = "facts"

    def contribute(self, source: ContextInput, draft: ContextDraft) -> None:
        parts = []
        if source.tenant_facts:
            parts.append(_facts_text("About this organisation", source.tenant_facts))
        if source.user_facts:
            parts.append(_facts_text("About this user", source.user_facts))
        if parts:
            draft.messages.append({"role": "system", "content": "\n\n".join(parts)})


@dataclass(frozen=True)
class History:
    name: str = "history"

    def contribute(self, source: ContextInput, draft: ContextDraft) -> None:
        turns = sorted({t.turn_seq: t for t in source.history}.values(), key=lambda t: t.turn_seq)
        chosen: list[Turn] = []
        used = 0
        for turn in reversed(turns):  # newest first, whole turns only
            tokens = count_messages(list(turn.messages), source.model)
            if source.history_token_budget is not None and used + tokens > source.history_token_budget:
                break
            chosen.append(turn)
            used += tokens
        for turn in reversed(chosen):
            draft.messages.extend(dict(m) for m in turn.messages)


@dataclass(frozen=True)
class UserMessage:
    name: str = "user_message"

    def contribute(self, source: ContextInput, draft: ContextDraft) -> None:
        draft.messages.append({"role": "user", "content": source.user_message})


@dataclass(frozen=True)
class BusinessKeys:
    """Client business keys and session counters: state only, never messages."""

    name: str = "business_keys"

    def contribute(self, source: ContextInput, draft: ContextDraft) -> None:
        for key, value in source.business.items():
            check_writable_key(str(key), source=f"business key {key!r}")
            draft.state[str(key)] = value
        if source.user_tier is not None:
            draft.state[USER_TIER] = source.user_tier
        draft.state[SESSION_MODEL_CALLS] = source.session_model_calls
        draft.state[SESSION_USAGE] = dict(source.session_usage)


DEFAULT_CONTRIBUTORS: tuple[ContextContributor, ...] = (
    SystemPrompt(),
    Facts(),
    History(),
    UserMessage(),
    BusinessKeys(),
)


def assemble_context(source: ContextInput, contributors: Sequence[ContextContributor] = DEFAULT_CONTRIBUTORS) -> Checkpoint:
    """Run the chain in order and return the initial checkpoint for a new run."""
    draft = ContextDraft()
    report: list[dict[str, Any]] = []
    for contributor in contributors:
        before = len(draft.messages)
        contributor.contribute(source, draft)
        added = draft.messages[before:]
        report.append({"name": contributor.name, "messages": len(added), "tokens": count_messages(added, source.model)})
    draft.state[ASSEMBLY] = report
    return Checkpoint(messages=draft.messages, state=draft.state)
