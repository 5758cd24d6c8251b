"""Hooks: small decisions at fixed points of a run, with access to the business state.

Positions: ``before_agent`` (once, before the first step), ``before_model`` and ``after_model``
(around every agent model call), ``after_agent`` (once, when the run finished; it may record
state but cannot change the outcome). A hook returns a :class:`HookResult` (or ``None``):
``updates`` are merged into the state by the key's strategy; ``jump_to=END`` stops the run
gracefully with ``message`` for the user and ``terminal_reason`` (default ``limit_reached``).

Hooks come from two places: the agent version's JSON policy (its ``hooks`` entries name a kind from
the extension table, :mod:`runtime.plugins`: the built-in kinds of :data:`HOOK_KINDS` and the
hook classes installed packages contribute) and Python objects passed to
:class:`~runtime.loop.AgentLoop`. Names are unique per agent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Protocol

from runtime.state import StateError, check_json, check_writable_key
from runtime.types import Message, ModelResponse, TerminalReason, Usage

END = "end"


class HookConfigError(StateError):
    """A hook is misconfigured (forbidden key, duplicate name, unknown kind)."""


class HookPosition(StrEnum):
    BEFORE_AGENT = "before_agent"
    BEFORE_MODEL = "before_model"
    AFTER_MODEL = "after_model"
    AFTER_AGENT = "after_agent"


@dataclass(frozen=True)
class HookContext:
    """What a hook may read. ``state`` and ``messages`` are read-only copies."""

    run_id: str
    step: int
    position: HookPosition
    state: Mapping[str, Any]
    messages: Sequence[Message]
    usage: Usage
    elapsed_seconds: float
    response: ModelResponse | None = None
    terminal_reason: TerminalReason | None = None


@dataclass(frozen=True)
class HookResult:
    updates: Mapping[str, Any] = field(default_factory=dict)
    jump_to: str | None = None
    message: str | None = None
    terminal_reason: TerminalReason = TerminalReason.LIMIT_REACHED
    reason: str = ""

    @classmethod
    def end(cls, message: str | None, *, reason: str, terminal: TerminalReason = TerminalReason.LIMIT_REACHED) -> HookResult:
        return cls(jump_to=END, message=message, terminal_reason=terminal, reason=reason)


class Hook(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def positions(self) -> frozenset[HookPosition]: ...

    def __call__(self, ctx: HookContext) -> HookResult | None: ...


def check_hook_names(names: Sequence[str], *, path: str = "hooks") -> list[str]:
    """Errors for empty or duplicated hook names (reported when an agent version is saved)."""
    errors: list[str] = []
    seen: set[str] = set()
    for name in names:
        if not name:
            errors.append(f"{path}: every hook needs a non-empty name")
        elif name in seen:
            errors.append(f"{path}: hook name {name!r} is used twice; hook names must be unique per agent")
        seen.add(name)
    return errors


def check_result(hook: Hook, position: HookPosition, result: HookResult) -> None:
    """The run-time twin of the save-time checks: refuse ``messages`` and bookkeeping keys."""
    source = f"hook {hook.name!r} at {position.value}"
    for key, value in result.updates.items():
        check_writable_key(str(key), source=source)
        check_json(value, source=f"{source}: key {key!r}")
    if result.jump_to not in (None, END):
        raise HookConfigError(f"{source}: jump_to must be None or 'end', got {result.jump_to!r}")


# -- declarative hook kinds (built from JSON) -----------------------------------------------


@dataclass(frozen=True)
class SetStateHook:
    """``{"kind": "set_state", "position": "before_agent", "values": {"escalation": false}}``."""

    name: str
    position: HookPosition
    values: Mapping[str, Any]

    @property
    def positions(self) -> frozenset[HookPosition]:
        return frozenset({self.position})

    def __call__(self, ctx: HookContext) -> HookResult | None:
        return HookResult(updates=dict(self.values), reason="set_state")


@dataclass(frozen=True)
class StopWhenHook:
    """``{"kind": "stop_when", "key": "escalated", "equals": true, "message": "..."}`` at before_model."""

    name: str
    key: str
    equals: Any
    message: str

    @property
    def positions(self) -> frozenset[HookPosition]:
        return frozenset({HookPosition.BEFORE_MODEL})

    def __call__(self, ctx: HookContext) -> HookResult | None:
        if self.key in ctx.state and ctx.state[self.key] == self.equals:
            return HookResult.end(self.message, reason=f"state {self.key!r} equals {self.equals!r}")
        return None


@dataclass(frozen=True)
class HookKind:
    """A built-in kind: ``validate(params, path) -> errors`` then ``build(name, params) -> Hook``; ``schema``
    (JSON Schema of the entry's fields) is what ``manage.py list_extensions`` shows."""

    validate: Callable[[Mapping[str, Any], str], list[str]]
    build: Callable[[str, Mapping[str, Any]], Hook]
    schema: Mapping[str, Any] = field(default_factory=dict)


def _check_params(params: Mapping[str, Any], path: str, allowed: set[str], required: set[str]) -> list[str]:
    errors = [f"{path}.{k}: unknown field; expected one of {sorted(allowed)}" for k in params if k not in allowed]
    errors += [f"{path}.{k}: is required" for k in sorted(required) if k not in params]
    return errors


def _validate_set_state(params: Mapping[str, Any], path: str) -> list[str]:
    errors = _check_params(params, path, {"name", "kind", "position", "values"}, {"position", "values"})
    position = params.get("position")
    if "position" in params and position not in {p.value for p in HookPosition}:
        errors.append(f"{path}.position: must be one of {[p.value for p in HookPosition]}, got {position!r}")
    values = params.get("values")
    if "values" in params and not isinstance(values, dict):
        errors.append(f"{path}.values: must be an object of state keys, got {type(values).__name__}")
    elif isinstance(values, dict):
        for key, value in values.items():
            try:
                check_writable_key(str(key), source=f"{path}.values.{key}")
                check_json(value, source=f"{path}.values.{key}")
            except StateError as exc:
                errors.append(str(exc))
    return errors


def _validate_stop_when(params: Mapping[str, Any], path: str) -> list[str]:
    errors = _check_params(params, path, {"name", "kind", "key", "equals", "message"}, {"key", "equals", "message"})
    for key in ("key", "message"):
        if key in params and (not isinstance(params[key], str) or not params[key]):
            errors.append(f"{path}.{key}: must be a non-empty string, got {params[key]!r}")
    return errors


_NAME_AND_KIND: dict[str, Any] = {"name": {"type": "string", "minLength": 1}, "kind": {"type": "string"}}

HOOK_KINDS: Mapping[str, HookKind] = MappingProxyType(
    {
        "set_state": HookKind(
            _validate_set_state,
            lambda name, p: SetStateHook(name, HookPosition(p["position"]), dict(p["values"])),
            {
                "type": "object",
                "properties": {
                    **_NAME_AND_KIND,
                    "position": {"enum": [p.value for p in HookPosition]},
                    "values": {"type": "object", "description": "state keys to set (never messages or '_' keys)"},
                },
                "required": ["name", "kind", "position", "values"],
                "additionalProperties": False,
            },
        ),
        "stop_when": HookKind(
            _validate_stop_when,
            lambda name, p: StopWhenHook(name, str(p["key"]), p["equals"], str(p["message"])),
            {
                "type": "object",
                "properties": {
                    **_NAME_AND_KIND,
                    "key": {"type": "string", "minLength": 1},
                    "equals": {"description": "any JSON value"},
                    "message": {"type": "string", "minLength": 1},
                },
                "required": ["name", "kind", "key", "equals", "message"],
                "additionalProperties": False,
            },
        ),
    }
)
