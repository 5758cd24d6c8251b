"""Extensions: the hook and interceptor kinds a version's policy may name, in one table.

The table holds the built-in hook kinds (:data:`runtime.hooks.HOOK_KINDS`: ``set_state``,
``stop_when``) and the classes installed packages contribute through entry points::

    [agentops.hooks]
    acme.redact_pii = acme_agentops.hooks:RedactPii
    [agentops.model_interceptors]
    acme.tag_request = acme_agentops.interceptors:TagRequest
    [agentops.tool_interceptors]
    acme.trim_result = acme_agentops.interceptors:TrimResult

A policy names them by kind (only names from this table are ever looked up: a tenant's policy can never
make the platform import a module path)::

    "hooks": [{"name": "pii", "kind": "acme.redact_pii", "config": {"mask": "***"}}],
    "interceptors": {"model": [{"kind": "acme.tag_request", "config": {}}], "tool": []}

A contributed class

* declares its configuration as a pydantic model in ``config_model`` (no ``config_model``: it takes no
  configuration; ``model_config = ConfigDict(extra="forbid")`` is recommended so typos are refused);
* is constructed with one argument, the validated configuration (an instance of ``config_model``);
* a hook has ``positions`` (:class:`~runtime.hooks.HookPosition` values or their names) and is
  called with a :class:`~runtime.hooks.HookContext`, returning a ``HookResult`` or ``None``;
* a model interceptor is called as ``(request, call_next) -> ModelResponse``; a tool interceptor as
  ``(call, ctx, call_next) -> ToolOutcome`` (see :mod:`runtime.interceptors`).

Kinds contributed by packages are namespaced (``acme.redact_pii``), so they never shadow a built-in.
Loading never raises: a bad entry point, an import error or a class that does not implement the
protocol makes that extension *unavailable*, with the reason (``manage.py list_extensions`` shows it);
the same kind offered by two distributions is unavailable too. A platform allow-list (``configure``)
restricts which contributed kinds are usable; one outside it is not even imported.
"""

from __future__ import annotations

import fnmatch
import inspect
import logging
import re
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from importlib import metadata
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from runtime.hooks import HOOK_KINDS, Hook, HookConfigError, HookContext, HookKind, HookPosition, HookResult, check_hook_names
from runtime.interceptors import ModelInterceptor, ToolInterceptor

log = logging.getLogger(__name__)


class Role(StrEnum):
    HOOK = "hook"
    MODEL_INTERCEPTOR = "model_interceptor"
    TOOL_INTERCEPTOR = "tool_interceptor"


#: The entry-point group of each role.
GROUPS: Mapping[Role, str] = {
    Role.HOOK: "agentops.hooks",
    Role.MODEL_INTERCEPTOR: "agentops.model_interceptors",
    Role.TOOL_INTERCEPTOR: "agentops.tool_interceptors",
}

BUILTIN = "built-in"
#: A contributed kind is ``namespace.name`` (lower case): built-in kinds have no dot, so they cannot be shadowed.
KIND_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")

_NOUN = {Role.HOOK: "hook", Role.MODEL_INTERCEPTOR: "model interceptor", Role.TOOL_INTERCEPTOR: "tool interceptor"}
#: What ``__call__`` takes, after ``self``.
_CALL_ARGS = {Role.HOOK: ("ctx",), Role.MODEL_INTERCEPTOR: ("request", "call_next"), Role.TOOL_INTERCEPTOR: ("call", "ctx", "call_next")}
#: The fields of a policy entry naming a contributed kind (built-in hook kinds have their own fields).
_ENTRY_FIELDS = {
    Role.HOOK: ("name", "kind", "config"),
    Role.MODEL_INTERCEPTOR: ("kind", "config"),
    Role.TOOL_INTERCEPTOR: ("kind", "config"),
}


class ExtensionError(RuntimeError):
    """A contributed extension could not be built for a run (its constructor raised, or bad ``positions``)."""


class _NoConfig(BaseModel):
    """The configuration of a class without ``config_model``: none."""

    model_config = ConfigDict(extra="forbid")


Validate = Callable[[Mapping[str, Any], str], list[str]]
Build = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Extension:
    """One row of the table. ``validate(entry, path) -> errors`` and ``build(entry)`` exist when available."""

    kind: str
    role: Role
    source: str  # "built-in", or the contributing distribution's "name version"
    target: str = ""  # the entry point's "module:attr" (empty for built-ins)
    schema: Mapping[str, Any] | None = None
    available: bool = True
    reason: str = ""
    validate: Validate | None = field(default=None, repr=False, compare=False)
    build: Build | None = field(default=None, repr=False, compare=False)

    @property
    def group(self) -> str:
        return GROUPS[self.role]

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description (for the ``list_extensions`` command)."""
        return {
            "kind": self.kind,
            "role": self.role.value,
            "group": self.group,
            "source": self.source,
            "target": self.target,
            "available": self.available,
            "reason": self.reason,
            "schema": dict(self.schema) if self.schema is not None else None,
        }


@dataclass(frozen=True)
class ContributedHook:
    """A contributed hook instance under the name its policy entry gives it."""

    name: str
    kind: str
    positions: frozenset[HookPosition]
    impl: Callable[[HookContext], Any]

    def __call__(self, ctx: HookContext) -> HookResult | None:
        result = self.impl(ctx)
        if result is not None and not isinstance(result, HookResult):
            raise HookConfigError(f"hook {self.name!r} ({self.kind}) returned {type(result).__name__}; expected a HookResult or None")
        return result


class ExtensionRegistry:
    """The table: one lookup for built-in and contributed kinds, by role."""

    def __init__(self, extensions: Iterable[Extension]) -> None:
        grouped: dict[tuple[Role, str], list[Extension]] = {}
        for ext in extensions:
            grouped.setdefault((ext.role, ext.kind), []).append(ext)
        self._table: dict[tuple[Role, str], Extension] = {}
        for key, found in grouped.items():
            if len(found) == 1:
                self._table[key] = found[0]
                continue
            sources = ", ".join(sorted(e.source for e in found))
            first = sorted(found, key=lambda e: e.source)[0]
            self._table[key] = replace(first, source=sources, available=False, validate=None, build=None,
                                       reason=f"the kind is contributed by more than one distribution ({sources}); uninstall one")

    def __iter__(self) -> Iterator[Extension]:
        order = list(Role)
        return iter(sorted(self._table.values(), key=lambda e: (order.index(e.role), e.source != BUILTIN, e.kind)))

    def __len__(self) -> int:
        return len(self._table)

    def get(self, role: Role, kind: str) -> Extension | None:
        return self._table.get((role, kind))

    def kinds(self, role: Role) -> list[str]:
        """The available kinds of a role, sorted."""
        return sorted(k for (r, k), ext in self._table.items() if r == role and ext.available)

    def unavailable(self) -> list[Extension]:
        return [ext for ext in self if not ext.available]

    # -- save time -------------------------------------------------------------------------

    def check_entries(self, role: Role, entries: Any, *, path: str, reserved: Sequence[str] = ()) -> list[str]:
        """Every problem of a policy list naming extensions of ``role`` (hooks: also names, unique and not ``reserved``)."""
        noun = _NOUN[role]
        if not isinstance(entries, list):
            return [f"{path}: must be a list of {noun} objects, got {_type_name(entries)}"]
        errors: list[str] = []
        names: list[str] = []
        for index, entry in enumerate(entries):
            where = f"{path}[{index}]"
            if not isinstance(entry, dict):
                fields = "name, kind and the kind's fields" if role == Role.HOOK else "kind and config"
                errors.append(f"{where}: must be an object with {fields}, got {_type_name(entry)}")
                continue
            if role == Role.HOOK:
                name = entry.get("name")
                if not isinstance(name, str) or not name:
                    errors.append(f"{where}.name: must be a non-empty string, got {name!r}")
                else:
                    names.append(name)
                    if name in reserved:
                        errors.append(f"{where}.name: {name!r} is the name of a built-in hook of this agent; choose another name")
            kind = entry.get("kind")
            ext = self.get(role, kind) if isinstance(kind, str) else None
            if ext is None or ext.validate is None:
                state = "unknown" if ext is None else "not available on this platform:"
                errors.append(f"{where}.kind: {state} {noun} kind {kind!r}; expected one of {self.kinds(role)}")
                continue
            errors += ext.validate(entry, where)
        if role == Role.HOOK:
            errors += check_hook_names(names, path=path)
        return errors

    # -- run time --------------------------------------------------------------------------

    def build_hooks(self, entries: Sequence[Mapping[str, Any]], *, path: str = "hooks") -> list[Hook]:
        return [self._build(Role.HOOK, entry, f"{path}[{i}]") for i, entry in enumerate(entries)]

    def build_model_interceptors(self, entries: Sequence[Mapping[str, Any]], *, path: str = "interceptors.model") -> list[ModelInterceptor]:
        return [self._build(Role.MODEL_INTERCEPTOR, entry, f"{path}[{i}]") for i, entry in enumerate(entries)]

    def build_tool_interceptors(self, entries: Sequence[Mapping[str, Any]], *, path: str = "interceptors.tool") -> list[ToolInterceptor]:
        return [self._build(Role.TOOL_INTERCEPTOR, entry, f"{path}[{i}]") for i, entry in enumerate(entries)]

    def _build(self, role: Role, entry: Mapping[str, Any], where: str) -> Any:
        """Build a validated entry (the policy was checked against this table first)."""
        kind = str(entry.get("kind"))
        ext = self.get(role, kind)
        if ext is None or ext.build is None:
            raise ExtensionError(f"{where}: {_NOUN[role]} kind {kind!r} is not available (any more); available: {self.kinds(role)}")
        try:
            return ext.build(entry)
        except (ExtensionError, HookConfigError):
            raise
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            raise ExtensionError(f"{where}: {_NOUN[role]} {kind!r} from {ext.source} could not be built: {problem}") from exc


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


# -- built-ins -----------------------------------------------------------------------------


def _builtin_hook(kind: str, spec: HookKind) -> Extension:
    def build(entry: Mapping[str, Any]) -> Hook:
        return spec.build(str(entry["name"]), entry)

    return Extension(kind, Role.HOOK, BUILTIN, schema=spec.schema, validate=spec.validate, build=build)


def builtin_extensions() -> list[Extension]:
    return [_builtin_hook(kind, spec) for kind, spec in HOOK_KINDS.items()]


# -- contributed classes -------------------------------------------------------------------


class _NotAnExtension(Exception):
    """The loaded object does not implement the protocol (the message says how)."""


def _positions(value: Any) -> frozenset[HookPosition]:
    options = [p.value for p in HookPosition]
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValueError(f"positions must be a set of {options}, got {value!r}")
    try:
        positions = frozenset(HookPosition(p) for p in value)
    except ValueError:
        raise ValueError(f"positions must be a set of {options}, got {sorted(map(str, value))}") from None
    if not positions:
        raise ValueError(f"positions must name at least one of {options}")
    return positions


def _loc(loc: Sequence[Any]) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def _config_errors(model: type[BaseModel], config: Any, where: str) -> list[str]:
    if not isinstance(config, dict):
        return [f"{where}.config: must be an object, got {_type_name(config)}"]
    try:
        model.model_validate(config)
    except ValidationError as exc:
        errors = []
        for error in exc.errors(include_url=False):
            got = ""
            if error.get("type") != "missing" and not isinstance(error.get("input"), dict | list):
                got = f", got {error.get('input')!r}"[:120]
            errors.append(f"{where}.config{_loc(error.get('loc', ()))}: {error.get('msg')}{got}")
        return errors
    except Exception as exc:  # a validator of the plugin's model that crashed
        return [f"{where}.config: could not be checked ({type(exc).__name__}: {exc})"]
    return []


def _accepts(func: Any, count: int) -> bool:
    try:
        inspect.signature(func).bind(*([None] * count))
    except TypeError:
        return False
    except ValueError:  # no signature to inspect (a builtin): assume it does
        return True
    return True


def inspect_class(role: Role, kind: str, obj: Any) -> tuple[type[BaseModel], Validate, Build]:
    """Check a contributed object against the protocol of ``role``; raise :class:`_NotAnExtension` saying why."""
    noun = _NOUN[role]
    if not isinstance(obj, type):
        raise _NotAnExtension(f"must be a class, got {type(obj).__name__}")
    model = getattr(obj, "config_model", None) or _NoConfig
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise _NotAnExtension(f"config_model must be a pydantic model class (a subclass of pydantic.BaseModel), got {model!r}")
    if not _accepts(obj, 1):
        raise _NotAnExtension("its constructor must take one argument, the validated config")
    call = next((vars(k)["__call__"] for k in obj.__mro__[:-1] if "__call__" in vars(k)), None)
    args = _CALL_ARGS[role]
    if call is None or not _accepts(call, 1 + len(args)):
        raise _NotAnExtension(f"a {noun} must be callable as ({', '.join(args)})")
    if role == Role.HOOK:
        if not hasattr(obj, "positions"):
            raise _NotAnExtension("a hook class must declare positions, e.g. positions = frozenset({HookPosition.BEFORE_MODEL})")
        declared = inspect.getattr_static(obj, "positions")
        if not isinstance(declared, property):
            try:
                _positions(declared)
            except ValueError as exc:
                raise _NotAnExtension(str(exc)) from None
    fields = _ENTRY_FIELDS[role]

    def validate(entry: Mapping[str, Any], where: str) -> list[str]:
        errors = [f"{where}.{k}: unknown field; expected one of {list(fields)}" for k in entry if k not in fields]
        return errors + _config_errors(model, entry.get("config", {}), where)

    def build(entry: Mapping[str, Any]) -> Any:
        instance = obj(model.model_validate(entry.get("config", {})))
        if role != Role.HOOK:
            return instance
        try:
            positions = _positions(getattr(instance, "positions", None))
        except ValueError as exc:
            raise ExtensionError(f"hook kind {kind!r}: {exc}") from None
        return ContributedHook(str(entry["name"]), kind, positions, instance)

    return model, validate, build


def _source(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown distribution"
    return f"{dist.name} {dist.version}"


def allowed_by(kind: str, allowed: Collection[str] | None) -> bool:
    """``allowed`` holds kinds or shell patterns (``acme.*``); ``None`` allows every installed kind."""
    return allowed is None or any(fnmatch.fnmatchcase(kind, pattern) for pattern in allowed)


def load_entry_point(role: Role, ep: metadata.EntryPoint, allowed: Collection[str] | None = None) -> Extension:
    """One contributed extension; never raises (a problem makes it unavailable, with the reason)."""
    base = Extension(ep.name, role, _source(ep), target=ep.value, available=False)
    if not KIND_NAME.match(ep.name):
        return replace(base, reason="a contributed kind must be namespaced in lower case, e.g. 'acme.redact_pii'")
    if not allowed_by(ep.name, allowed):
        return replace(base, reason="not in the platform's allow-list of extensions")
    try:
        obj = ep.load()
    except (Exception, SystemExit) as exc:
        return replace(base, reason=f"could not be imported: {type(exc).__name__}: {exc}")
    try:
        model, validate, build = inspect_class(role, ep.name, obj)
        schema = model.model_json_schema()
    except _NotAnExtension as exc:
        return replace(base, reason=f"does not implement the {_NOUN[role]} protocol: {exc}")
    except Exception as exc:
        return replace(base, reason=f"could not be inspected: {type(exc).__name__}: {exc}")
    return replace(base, available=True, schema=schema, validate=validate, build=build)


def discover(*, allowed: Collection[str] | None = None) -> ExtensionRegistry:
    """The built-ins and every installed entry point of :data:`GROUPS`; unavailable ones are logged."""
    extensions = builtin_extensions()
    for role, group in GROUPS.items():
        try:
            entry_points = list(metadata.entry_points(group=group))
        except Exception:
            log.exception("the installed distributions' entry points (%s) could not be read", group)
            continue
        extensions += [load_entry_point(role, ep, allowed) for ep in entry_points]
    registry = ExtensionRegistry(extensions)
    for ext in registry.unavailable():
        log.warning("extension %s (%s, from %s) is unavailable: %s", ext.kind, ext.group, ext.source, ext.reason)
    return registry


# -- the process-wide table ----------------------------------------------------------------

_lock = threading.Lock()
_allowed: frozenset[str] | None = None
_default: ExtensionRegistry | None = None


def configure(*, allowed: Iterable[str] | None) -> None:
    """Set the platform's allow-list (kinds or patterns; ``None``: every installed kind) and forget the table."""
    global _allowed, _default
    with _lock:
        _allowed = None if allowed is None else frozenset(allowed)
        _default = None


def clear_cache() -> None:
    """Forget the table: the next lookup reads the installed entry points again."""
    global _default
    with _lock:
        _default = None


def default_registry() -> ExtensionRegistry:
    """The process-wide table, discovered on first use."""
    global _default
    with _lock:
        if _default is None:
            _default = discover(allowed=_allowed)
        return _default
