"""RunState: the small JSON business state of a run, with a merge strategy per key.

Two worlds live side by side in a checkpoint and must not mix:

* ``messages`` (``Checkpoint.messages``) is what the model sees. Only the loop writes it, and only
  by appending. A hook that returns ``messages`` is a configuration error: the loop would append
  the conversation a second time and double the tokens of every later call.
* ``Checkpoint.state`` is business state (``flight_no``, ``user_tier``, ``llm_call_count``, ...).
  It never reaches the model unless an operator pins a key on purpose (see compression).
  Keys starting with ``_`` are the loop's own bookkeeping; hooks cannot write them.

Keys the Django side puts in the *initial* state (all optional):

``user_tier``            the user's tier, read by the tier limit (e.g. ``"free"``).
``session_model_calls``  model calls made by the session's *earlier* runs (thread limit).
``session_usage``        the session's earlier usage: ``{"input_tokens", "output_tokens", "cost",
                         "wall_seconds"}`` (session budgets).

Keys the runtime maintains (readable by hooks, visible to operators):

``llm_call_count``       model calls of this run (agent calls; summaries are not counted).
``loop_detection``       the loop detector's counters.
``_context``             summary / pinned facts that replace older messages in the model's view.
``_active_seconds``      wall time the run has been executing (pauses in WAITING excluded).
``_tool_failure_streak`` consecutive failed tool calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

MESSAGES = "messages"
USER_TIER = "user_tier"
LLM_CALL_COUNT = "llm_call_count"
SESSION_MODEL_CALLS = "session_model_calls"
SESSION_USAGE = "session_usage"
LOOP_DETECTION = "loop_detection"

CONTEXT = "_context"
ACTIVE_SECONDS = "_active_seconds"
TOOL_FAILURE_STREAK = "_tool_failure_streak"
TERMINAL_REASON = "_terminal_reason"
OUTPUT = "_output"
ROOT_SPAN = "_root_span"
ASSEMBLY = "_assembly"

MESSAGES_REFUSAL = (
    "'messages' is written only by the agent loop; a hook that returns it would append the conversation "
    "again and double the tokens of every later model call. Put the value in a business key instead "
    "(it stays out of the model's view), or change the system prompt / context contributors"
)


class StateError(ValueError):
    """A configuration error about state: a forbidden key, a value that is not JSON, a bad strategy."""


class MergeStrategy(StrEnum):
    REPLACE = "replace"
    APPEND = "append"


def check_writable_key(key: str, *, source: str) -> None:
    """Raise :class:`StateError` when ``source`` (a hook, a config entry) may not write ``key``."""
    if key == MESSAGES:
        raise StateError(f"{source}: {MESSAGES_REFUSAL}")
    if key.startswith("_"):
        raise StateError(f"{source}: keys starting with '_' belong to the agent loop; got {key!r}. Use a name without '_'")
    if not key:
        raise StateError(f"{source}: state keys must be non-empty strings")


def check_json(value: Any, *, source: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StateError(f"{source}: value must be JSON-serialisable ({exc})") from exc


@dataclass(frozen=True)
class StateSchema:
    """Merge strategies per key; keys not listed are replaced."""

    strategies: Mapping[str, MergeStrategy] = field(default_factory=dict)

    def strategy(self, key: str) -> MergeStrategy:
        return self.strategies.get(key, MergeStrategy.REPLACE)

    def validate(self, updates: Mapping[str, Any], *, source: str) -> None:
        for key, value in updates.items():
            if not isinstance(key, str):
                raise StateError(f"{source}: state keys must be strings, got {key!r}")
            check_writable_key(key, source=source)
            check_json(value, source=f"{source}: key {key!r}")

    def merge(self, state: Mapping[str, Any], updates: Mapping[str, Any], *, source: str) -> dict[str, Any]:
        """Return a new state with ``updates`` merged in; raise :class:`StateError` on a forbidden update."""
        self.validate(updates, source=source)
        return merge_unchecked(state, updates, self)


def merge_unchecked(state: Mapping[str, Any], updates: Mapping[str, Any], schema: StateSchema) -> dict[str, Any]:
    """Merge without key checks; for the loop's own bookkeeping."""
    merged = dict(state)
    for key, value in updates.items():
        if schema.strategy(key) == MergeStrategy.APPEND:
            current = merged.get(key)
            existing = list(current) if isinstance(current, list) else ([] if current is None else [current])
            merged[key] = existing + (list(value) if isinstance(value, list) else [value])
        else:
            merged[key] = value
    return merged


def business_view(state: Mapping[str, Any]) -> dict[str, Any]:
    """The state without the loop's bookkeeping (what an operator or a hook usually wants)."""
    return {k: v for k, v in state.items() if not k.startswith("_")}


def parse_strategies(data: Mapping[str, Any], *, path: str) -> tuple[StateSchema, list[str]]:
    """Build a schema from ``{"key": "append"|"replace"}``; returns (schema, errors)."""
    errors: list[str] = []
    strategies: dict[str, MergeStrategy] = {}
    for key, value in data.items():
        where = f"{path}.{key}"
        try:
            check_writable_key(str(key), source=where)
        except StateError as exc:
            errors.append(str(exc))
            continue
        if value not in {s.value for s in MergeStrategy}:
            errors.append(f"{where}: must be 'append' or 'replace', got {value!r}")
            continue
        strategies[str(key)] = MergeStrategy(value)
    return StateSchema(strategies), errors
