"""Built-in limit hooks: model calls per run and per session, per-tier limits, loop detection."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.hooks import HookContext, HookPosition, HookResult
from runtime.state import LLM_CALL_COUNT, LOOP_DETECTION, SESSION_MODEL_CALLS, TOOL_FAILURE_STREAK, USER_TIER
from runtime.types import TerminalReason, ToolCall

LIMIT_MESSAGE = (
    "I have reached the maximum number of steps allowed for {scope}, so I stopped here. "
    "Please narrow the question or start a new conversation."
)
LOOP_MESSAGE = (
    "I stopped because I was repeating the same action without making progress. Please rephrase the request or contact an operator."
)


def _count(state: Mapping[str, Any], key: str) -> int:
    value = state.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _exit(behavior: str, message: str, reason: str) -> HookResult:
    if behavior == "error":
        return HookResult.end(None, reason=reason, terminal=TerminalReason.ERROR)
    return HookResult.end(message, reason=reason, terminal=TerminalReason.LIMIT_REACHED)


@dataclass(frozen=True)
class ModelCallLimit:
    """Counts agent model calls in ``llm_call_count`` and stops before a call beyond a limit.

    ``thread_limit`` counts the session's earlier runs too (``session_model_calls`` in the
    initial state). ``exit_behavior``: ``end`` (graceful, limit_reached) or ``error``.
    """

    run_limit: int | None = None
    thread_limit: int | None = None
    exit_behavior: str = "end"
    message: str | None = None
    name: str = "model_call_limit"
    positions: frozenset[HookPosition] = frozenset({HookPosition.BEFORE_MODEL, HookPosition.AFTER_MODEL})

    def __call__(self, ctx: HookContext) -> HookResult | None:
        run_count = _count(ctx.state, LLM_CALL_COUNT)
        if ctx.position == HookPosition.AFTER_MODEL:
            return HookResult(updates={LLM_CALL_COUNT: run_count + 1}, reason="model call counted")
        if self.run_limit is not None and run_count >= self.run_limit:
            reason = f"run model-call limit {self.run_limit} reached ({run_count} calls made)"
            return _exit(self.exit_behavior, self.message or LIMIT_MESSAGE.format(scope="one request"), reason)
        thread_count = _count(ctx.state, SESSION_MODEL_CALLS) + run_count
        if self.thread_limit is not None and thread_count >= self.thread_limit:
            reason = f"session model-call limit {self.thread_limit} reached ({thread_count} calls in this session)"
            return _exit(self.exit_behavior, self.message or LIMIT_MESSAGE.format(scope="this conversation"), reason)
        return None


@dataclass(frozen=True)
class TierLimit:
    """A model-call limit looked up by the user's tier (``user_tier`` in the state) in a tenant table.

    An unknown or missing tier uses ``default_tier``; if that is not in the table either, the
    smallest limit applies (fail closed).
    """

    table: Mapping[str, int]
    default_tier: str | None = None
    scope: str = "run"
    exit_behavior: str = "end"
    message: str | None = None
    name: str = "tier_limit"
    positions: frozenset[HookPosition] = frozenset({HookPosition.BEFORE_MODEL})

    def limit_for(self, tier: Any) -> tuple[str, int]:
        if isinstance(tier, str) and tier in self.table:
            return tier, self.table[tier]
        if self.default_tier is not None and self.default_tier in self.table:
            return self.default_tier, self.table[self.default_tier]
        smallest = min(self.table, key=lambda t: self.table[t])
        return smallest, self.table[smallest]

    def __call__(self, ctx: HookContext) -> HookResult | None:
        if not self.table:
            return None
        tier, limit = self.limit_for(ctx.state.get(USER_TIER))
        count = _count(ctx.state, LLM_CALL_COUNT)
        if self.scope == "session":
            count += _count(ctx.state, SESSION_MODEL_CALLS)
        if count < limit:
            return None
        reason = f"tier {tier!r} allows {limit} model calls per {self.scope}; {count} made"
        scope = "one request" if self.scope == "run" else "this conversation"
        return _exit(self.exit_behavior, self.message or LIMIT_MESSAGE.format(scope=f"{scope} on your plan"), reason)


def call_signature(call: ToolCall) -> str:
    """Tool name + canonical arguments (key order and whitespace do not matter), hashed short."""
    try:
        canonical = json.dumps(json.loads(call.arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, TypeError):
        canonical = " ".join(call.arguments.split())
    return hashlib.sha256(f"{call.name}\x00{canonical}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LoopDetection:
    """Ends the run as loop_detected when the model asks for the same tool call ``max_repeats``
    times (the repeated call is not executed), or after ``max_consecutive_failures`` failed tool
    calls in a row."""

    max_repeats: int | None = 3
    max_consecutive_failures: int | None = 3
    message: str | None = None
    name: str = "loop_detection"
    positions: frozenset[HookPosition] = field(default_factory=lambda: frozenset({HookPosition.BEFORE_MODEL, HookPosition.AFTER_MODEL}))

    def __call__(self, ctx: HookContext) -> HookResult | None:
        if ctx.position == HookPosition.BEFORE_MODEL:
            streak = _count(ctx.state, TOOL_FAILURE_STREAK)
            if self.max_consecutive_failures is not None and streak >= self.max_consecutive_failures:
                return HookResult.end(
                    self.message or LOOP_MESSAGE,
                    reason=f"{streak} tool calls failed in a row (limit {self.max_consecutive_failures})",
                    terminal=TerminalReason.LOOP_DETECTED,
                )
            return None
        if ctx.response is None or not ctx.response.tool_calls:
            return None
        previous = ctx.state.get(LOOP_DETECTION)
        counts: dict[str, int] = dict(previous.get("counts", {})) if isinstance(previous, dict) else {}
        repeated: tuple[str, int] | None = None
        for call in ctx.response.tool_calls:
            signature = call_signature(call)
            counts[signature] = counts.get(signature, 0) + 1
            if self.max_repeats is not None and counts[signature] >= self.max_repeats and repeated is None:
                repeated = (call.name, counts[signature])
        updates = {LOOP_DETECTION: {"counts": counts}}
        if repeated is None:
            return HookResult(updates=updates, reason="tool calls counted")
        return HookResult(
            updates=updates,
            jump_to="end",
            message=self.message or LOOP_MESSAGE,
            terminal_reason=TerminalReason.LOOP_DETECTED,
            reason=f"the model asked for {repeated[0]} with the same arguments {repeated[1]} times",
        )
