"""Keeping the model's context small: summarization, pre-emptive compression, context editing.

The message log is append-only, so condensing never rewrites it. A summary is bookkeeping in
``state["_context"]`` = ``{"summary": str, "through": n, "identifiers": [...], "pin_keys": [...]}``:
the model's *view* is the leading system messages, a pinned-facts message, the summary, then
``log[through:]`` (:func:`render_view`). Two kinds of pieces use it:

* compactors (:class:`Summarization`, :class:`Compression`) run before an agent model call and may
  make a ``task="summarize"`` model call; the loop stores the new ``_context``;
* request transforms (:class:`ContextEditing`, and :class:`Compression` as an interceptor) change
  only the request sent to the model: old tool results are replaced by a short placeholder.

Invariants: the system prompt is never condensed; the current user turn (the last user message)
is always in the view, verbatim, right after the summary when it was condensed, so a request never
lacks the question being answered; a cut never separates an assistant ``tool_calls`` message from
its tool results; the most recent tool results are never cleared.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from runtime import patterns as bounded
from runtime.interceptors import ModelCall
from runtime.state import CONTEXT
from runtime.tokens import count_messages, count_specs
from runtime.types import Message, ModelRequest, ModelResponse, ToolSpec

logger = logging.getLogger(__name__)

SUMMARY_PREFIX = "Summary of the earlier conversation (older messages were condensed to save space):\n"
PINNED_PREFIX = "Key facts (pinned, still valid):\n"
CLEARED = "[tool output cleared to save context; call the tool again if you need it]"
SUMMARY_INSTRUCTIONS = (
    "Condense the conversation below into a short factual summary for an assistant who will continue it. "
    "Keep names, identifiers, numbers, dates, decisions, and open questions. Do not invent anything."
)
DEFAULT_IDENTIFIER_PATTERNS = (r"\b[A-Z]{2,3}-?\d{2,8}\b", r"\b[A-Z0-9]{3,}-[A-Z0-9-]{3,}\b")


def head_length(log: Sequence[Message]) -> int:
    """Number of leading system messages (system prompt, tenant facts): never condensed."""
    index = 0
    while index < len(log) and log[index].get("role") == "system":
        index += 1
    return index


def current_turn_index(log: Sequence[Message]) -> int | None:
    """Index of the last user message: the question the run is answering now."""
    for index in range(len(log) - 1, -1, -1):
        if log[index].get("role") == "user":
            return index
    return None


def kept_tail(log: Sequence[Message], through: int) -> list[Message]:
    """``log[through:]``, preceded by the current user turn when the cut condensed it."""
    tail = [dict(m) for m in log[through:]]
    current = current_turn_index(log)
    if current is not None and head_length(log) <= current < through:
        tail.insert(0, dict(log[current]))
    return tail


def render_view(log: Sequence[Message], state: Mapping[str, Any]) -> list[Message]:
    """The messages the model sees: the log with condensed parts replaced by pinned facts + summary."""
    ctx = state.get(CONTEXT)
    head = head_length(log)
    if not isinstance(ctx, dict) or not ctx.get("summary"):
        return [dict(m) for m in log]
    view = [dict(m) for m in log[:head]]
    facts = [f"- {k}: {state[k]}" for k in ctx.get("pin_keys", []) if k in state]
    identifiers = ctx.get("identifiers") or []
    if identifiers:
        facts.append("- identifiers mentioned earlier: " + ", ".join(identifiers))
    if facts:
        view.append({"role": "system", "content": PINNED_PREFIX + "\n".join(facts)})
    view.append({"role": "system", "content": SUMMARY_PREFIX + str(ctx["summary"])})
    view.extend(kept_tail(log, max(int(ctx.get("through", head)), head)))
    return view


def request_tokens(messages: Sequence[Message], tools: Sequence[ToolSpec], model: str) -> int:
    return count_messages(list(messages), model) + count_specs(tools, model)


def safe_cut(log: Sequence[Message], cut: int, floor: int) -> int:
    """Move a cut back so it never falls between an assistant's tool_calls and their results."""
    cut = max(min(cut, len(log)), floor)
    while floor < cut < len(log) and log[cut].get("role") == "tool":
        cut -= 1
    return cut


def keep_cut(log: Sequence[Message], keep: int, floor: int) -> int:
    """Where to cut to keep about the last ``keep`` messages: never between a ``tool_calls`` message
    and its results, and, inside an earlier turn, moved forward to the next user message so the
    kept part starts with a whole turn (the view then reads system, summary, user, ...)."""
    cut = safe_cut(log, len(log) - max(keep, 1), floor)
    current = current_turn_index(log)
    if current is not None and floor <= cut < current:
        while log[cut].get("role") != "user":
            cut += 1
    return cut


def clear_tool_results(
    messages: Sequence[Message],
    model: str,
    *,
    target: int,
    at_least: int = 0,
    exclude: frozenset[str] = frozenset(),
    extra_tokens: int = 0,
) -> tuple[list[Message], int, int]:
    """Replace the oldest tool results with a placeholder until the total (plus ``extra_tokens``)
    is at most ``target`` and at least ``at_least`` tokens were freed.
    Returns (messages, results cleared, tokens freed). The last group of tool results is kept."""
    result = [dict(m) for m in messages]
    last_assistant = max((i for i, m in enumerate(result) if m.get("role") == "assistant"), default=len(result))
    total = count_messages(result, model) + extra_tokens
    cleared = freed = 0
    for index, message in enumerate(result):
        if total <= target and freed >= at_least:
            break
        if index >= last_assistant or message.get("role") != "tool" or message.get("content") == CLEARED:
            continue
        if message.get("name") in exclude:
            continue
        before = count_messages([message], model)
        message["content"] = CLEARED
        saved = before - count_messages([message], model)
        total -= saved
        freed += saved
        cleared += 1
    return result, cleared, freed


@dataclass(frozen=True)
class CompactionContext:
    model: str
    tools: Sequence[ToolSpec]
    context_window: int
    call_model: Callable[[ModelRequest], ModelResponse]


class Compactor(Protocol):
    @property
    def name(self) -> str: ...

    def compact(self, log: list[Message], state: Mapping[str, Any], ctx: CompactionContext) -> dict[str, Any] | None: ...


def _transcript(messages: Sequence[Message], per_message_chars: int = 2000) -> str:
    lines: list[str] = []
    for message in messages:
        role = str(message.get("role"))
        content = str(message.get("content") or "")[:per_message_chars]
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            content += f"\n[called {function.get('name')}({str(function.get('arguments'))[:500]})]"
        if role == "tool":
            role = f"tool {message.get('name', '')}".strip()
        lines.append(f"{role}: {content}")
    return "\n".join(lines)


def extract_identifiers(messages: Sequence[Message], patterns: Sequence[str], limit: int = 30) -> list[str]:
    """What the patterns (the version's ``identifier_patterns``, tenant input) find in the messages, newest last. A
    pattern that cannot be matched in time is dropped for the rest of the pass (and logged), not waited on."""
    found: list[str] = []
    live = list(patterns)
    with bounded.budget():
        for message in messages:
            text = str(message.get("content") or "")
            for call in message.get("tool_calls") or []:
                text += " " + str(call.get("function", {}).get("arguments", ""))
            for pattern in list(live):
                try:
                    matches = bounded.findall(pattern, text)
                except bounded.PatternError as exc:
                    logger.warning("identifier pattern dropped from this summary: %s", exc)
                    live.remove(pattern)
                    continue
                for match in matches:
                    value = match if isinstance(match, str) else match[0]
                    if value not in found:
                        found.append(value)
    return found[-limit:]


def summarize_older(
    log: list[Message],
    state: Mapping[str, Any],
    ctx: CompactionContext,
    *,
    keep_last: int,
    model: str | None,
    max_summary_tokens: int,
    pin_keys: Sequence[str] = (),
    identifier_patterns: Sequence[str] = (),
) -> dict[str, Any] | None:
    """Condense ``log`` up to the last ``keep_last`` messages into one summary; None if nothing new."""
    current = state.get(CONTEXT) if isinstance(state.get(CONTEXT), dict) else {}
    assert isinstance(current, dict)
    head = head_length(log)
    previous_through = max(int(current.get("through", head)), head)
    cut = keep_cut(log, keep_last, head)
    if cut <= previous_through:
        return None
    condensed = log[previous_through:cut]
    previous = str(current.get("summary") or "")
    text = (f"Summary so far:\n{previous}\n\n" if previous else "") + "New messages:\n" + _transcript(condensed)
    request = ModelRequest(
        model=model or ctx.model,
        messages=[{"role": "system", "content": SUMMARY_INSTRUCTIONS}, {"role": "user", "content": text}],
        tools=[],
        task="summarize",
        metadata={"condensed_messages": len(condensed), "through": cut},
        max_output_tokens=max_summary_tokens,
    )
    response = ctx.call_model(request)
    identifiers = list(current.get("identifiers") or [])
    if identifier_patterns:
        identifiers = [i for i in identifiers + extract_identifiers(condensed, identifier_patterns) if i]
        identifiers = list(dict.fromkeys(identifiers))[-30:]
    keys = list(dict.fromkeys([*current.get("pin_keys", []), *pin_keys]))
    return {"summary": response.content or "", "through": cut, "identifiers": identifiers, "pin_keys": keys}


@dataclass(frozen=True)
class Summarization:
    """Above ``token_threshold`` (the view as it would be sent), condense all but the last messages."""

    token_threshold: int
    keep_last: int = 6
    model: str | None = None
    max_summary_tokens: int = 512
    name: str = "summarization"

    def compact(self, log: list[Message], state: Mapping[str, Any], ctx: CompactionContext) -> dict[str, Any] | None:
        if request_tokens(render_view(log, state), ctx.tools, ctx.model) <= self.token_threshold:
            return None
        return summarize_older(log, state, ctx, keep_last=self.keep_last, model=self.model, max_summary_tokens=self.max_summary_tokens)


@dataclass(frozen=True)
class Compression:
    """Pre-emptive compression at ``window_share`` of the context window.

    First raw tool output is cleared from the request (:meth:`__call__`, request only); only if
    that is not enough are older turns summarised, with key facts (``pin_keys`` from the state,
    identifiers found in the condensed messages) pinned in a message right after the system prompt.
    """

    context_window: int
    window_share: float = 0.70
    keep_last: int = 6
    pin_keys: tuple[str, ...] = ()
    identifier_patterns: tuple[str, ...] = DEFAULT_IDENTIFIER_PATTERNS
    model: str | None = None
    max_summary_tokens: int = 512
    name: str = "compression"
    exclude_tools: frozenset[str] = field(default_factory=frozenset)

    @property
    def threshold(self) -> int:
        return int(self.context_window * self.window_share)

    def compact(self, log: list[Message], state: Mapping[str, Any], ctx: CompactionContext) -> dict[str, Any] | None:
        view = render_view(log, state)
        tools = count_specs(ctx.tools, ctx.model)
        if count_messages(view, ctx.model) + tools <= self.threshold:
            return None
        _, _, freed = clear_tool_results(view, ctx.model, target=self.threshold, extra_tokens=tools, exclude=self.exclude_tools)
        if count_messages(view, ctx.model) + tools - freed <= self.threshold:
            return None  # clearing raw tool output at request time is enough
        head = head_length(log)
        fixed = count_messages(list(log[:head]), ctx.model) + tools + self.max_summary_tokens
        keep = self.keep_last
        while keep > 1:  # keep as many recent messages as fit next to the head and a full-size summary
            tail = kept_tail(log, keep_cut(log, keep, head))
            if count_messages(tail, ctx.model) + fixed <= self.threshold:
                break
            keep -= 1
        return summarize_older(
            log,
            state,
            ctx,
            keep_last=keep,
            model=self.model,
            max_summary_tokens=self.max_summary_tokens,
            pin_keys=self.pin_keys,
            identifier_patterns=self.identifier_patterns,
        )

    def __call__(self, request: ModelRequest, call_next: ModelCall) -> ModelResponse:
        if request.task != "act":
            return call_next(request)
        tools = count_specs(request.tools, request.model)
        before = count_messages(request.messages, request.model) + tools
        if before <= self.threshold:
            return call_next(request)
        messages, cleared, freed = clear_tool_results(
            request.messages, request.model, target=self.threshold, extra_tokens=tools, exclude=self.exclude_tools
        )
        response = call_next(replace(request, messages=messages))
        response.trace.append({"type": "context.compressed", "tokens_before": before, "tokens_after": before - freed, "cleared": cleared})
        return response


@dataclass(frozen=True)
class ContextEditing:
    """Above ``trigger`` tokens, clear old tool results in the request (never in the state) until
    at most ``keep`` tokens remain, freeing at least ``clear_at_least``; ``exclude_tools`` are kept."""

    trigger: int
    keep: int
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = field(default_factory=frozenset)
    name: str = "context_editing"

    def __call__(self, request: ModelRequest, call_next: ModelCall) -> ModelResponse:
        if request.task != "act":
            return call_next(request)
        tools = count_specs(request.tools, request.model)
        before = count_messages(request.messages, request.model) + tools
        if before <= self.trigger:
            return call_next(request)
        messages, cleared, freed = clear_tool_results(
            request.messages,
            request.model,
            target=self.keep,
            at_least=self.clear_at_least,
            exclude=self.exclude_tools,
            extra_tokens=tools,
        )
        response = call_next(replace(request, messages=messages))
        response.trace.append({"type": "context.edited", "tokens_before": before, "tokens_after": before - freed, "cleared": cleared})
        return response
