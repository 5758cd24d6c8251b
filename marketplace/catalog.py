"""The plugin catalog: plugins declared in code, in an explicit registry frozen after start-up.

Built-in plugins register themselves from ``marketplace.builtin``; third-party packages expose a
:class:`PluginSpec` (or a callable returning one, or a list of them) through the ``agentops.plugins``
entry-point group::

    # pyproject.toml of a plugin package
    [project.entry-points."agentops.plugins"]
    weather = "agentops_weather:PLUGIN"

The database mirrors the catalog (a ``Plugin`` row per key + version, written by ``sync_plugins``
and after ``migrate``); nothing here touches the database.

A manifest is a typed document (``runtime.documents``): ``PluginSpec``, ``PluginTool``, ``AgentPreset`` and
``ToolOverrides`` are frozen pydantic models built by keyword (``PluginTool`` also takes its key first).
Building one checks what it says on its own; registering it checks it against the tool registry. Either
raises :class:`PluginDeclarationError` listing every problem with its path (``tools[1].overrides.rate_limit_per_minute: ...``).
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from importlib import metadata
from typing import Annotated, Any, TypeVar

from pydantic import ValidationError, ValidationInfo, field_validator, model_validator

from runtime import schemas
from runtime.documents import (
    Document,
    Flag,
    Leaf,
    choice,
    flag,
    integer,
    json_object,
    names,
    number,
    pattern,
    problem,
    problems,
    problems_of,
    text,
)
from tools.pyfunc import registry as python_tools
from tools.rate_limits import MAX_PER_MINUTE, value_problem

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agentops.plugins"
_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_VERSION_RE = re.compile(r"^\d+(\.\d+){0,3}([.-]?[A-Za-z0-9]+)?$")
_SLUG = r"^[a-z0-9][a-z0-9-]{0,62}$"
_UNSET: Any = object()
D = TypeVar("D", bound=Document)


class PluginDeclarationError(ValueError):
    """A plugin's declaration is inconsistent; ``errors`` lists every problem with its path (``tools[1].key: ...``)."""

    def __init__(self, errors: str | list[str], where: str = "") -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__(f"{where}: " + "; ".join(self.errors) if where else "; ".join(self.errors))


class CatalogFrozenError(RuntimeError):
    """A plugin was registered after start-up."""


#: Set while a declaration is being checked as a whole: nested parts then leave their errors to the whole.
_checking: contextvars.ContextVar[bool] = contextvars.ContextVar("checking_declaration", default=False)


def declaration_problems(model: type[D], data: Any, context: Mapping[str, Any] | None = None) -> tuple[D | None, list[str]]:
    """``runtime.documents.problems`` for a declaration: every problem, each with its path (``tools[1].key: ...``)."""
    token = _checking.set(True)
    try:
        return problems(model, data, context=context)
    finally:
        _checking.reset(token)


class Declaration(Document):
    """A part of a plugin's declaration: keyword construction checks it and lists every problem at once."""

    def __init__(self, /, **data: Any) -> None:
        if _checking.get():
            super().__init__(**data)
            return
        try:
            super().__init__(**data)
        except ValidationError:
            raise PluginDeclarationError(declaration_problems(type(self), data)[1], self._where(data)) from None

    @classmethod
    def _where(cls, data: Mapping[str, Any]) -> str:
        return cls.__name__


def _rate_limit(value: Any) -> int | None:
    found = value_problem(value)
    if found:
        raise problem(found)
    return value  # type: ignore[no-any-return]


_RATE_SCHEMA = {"type": "integer", "minimum": 1, "maximum": MAX_PER_MINUTE}


class ToolOverrides(Document):
    """The Tool fields a plugin may set per tool (besides ``requires_approval``); unset means the function's own."""

    category: Annotated[str | None, choice("read", "write")] = None
    idempotent: Annotated[bool | None, flag(nullable=True)] = None
    required_scopes: Annotated[list[str] | None, names(nullable=True)] = None
    timeout_seconds: Annotated[float | None, number(nullable=False, maximum=600)] = None
    result_fields: Annotated[list[str] | None, names(nullable=True)] = None
    summary_template: Annotated[str | None, text(nullable=False)] = None
    result_size_cap: Annotated[int | None, integer(100)] = None
    sensitive_fields: Annotated[list[str] | None, names(nullable=True)] = None
    description: Annotated[str | None, text(nullable=False)] = None
    #: Calls per minute per tenant; a floor: a tenant may lower it, never raise or remove it.
    rate_limit_per_minute: Annotated[int | None, Leaf(_rate_limit, _RATE_SCHEMA, nullable=True)] = None

    def declared(self) -> dict[str, Any]:
        """Only what the plugin set (what the ``Plugin`` row stores and the install applies)."""
        return self.model_dump(mode="json", exclude_unset=True)


#: The Tool fields a plugin may set per tool besides ``requires_approval`` (anything else is a declaration error).
TOOL_OVERRIDE_FIELDS = frozenset(ToolOverrides.model_fields)


class PluginTool(Declaration):
    """One Python tool (a key of ``tools.pyfunc.registry``) a plugin provides, with per-tool overrides."""

    key: Annotated[str, text(nullable=False)]
    requires_approval: Flag = False
    overrides: ToolOverrides = ToolOverrides()

    def __init__(self, key: Any = _UNSET, /, **data: Any) -> None:
        super().__init__(**(data if key is _UNSET else {"key": key, **data}))

    @classmethod
    def _where(cls, data: Mapping[str, Any]) -> str:
        return f"plugin tool {data.get('key')!r}"

    def as_json(self, registry: Any) -> dict[str, Any]:
        spec = registry.get(self.key)
        return {
            "key": self.key, "name": spec.name, "category": self.overrides.category or spec.category,
            "requires_approval": self.requires_approval, "overrides": self.overrides.declared(),
        }


class AgentPreset(Declaration):
    """A ready-made agent: what its first version is made of (``policy`` is checked when the version is made)."""

    slug: Annotated[str, pattern(_SLUG, "must be lower-case letters, digits and '-', e.g. 'order-desk-assistant'")]
    name: Annotated[str, text(nullable=False)]
    system_prompt: Annotated[str, text(nullable=False)]
    model: Annotated[str, text(nullable=False, example="demo/planner")]
    tools: tuple[Annotated[str, text(nullable=False)], ...] = ()
    policy: Annotated[dict[str, Any], json_object("must be an object (an agent version's policy)")] = {}
    description: str = ""

    @classmethod
    def _where(cls, data: Mapping[str, Any]) -> str:
        return f"preset {data.get('slug')!r}"

    def as_json(self) -> dict[str, Any]:
        return {
            "slug": self.slug, "name": self.name, "description": self.description, "system_prompt": self.system_prompt,
            "model": self.model, "tools": list(self.tools), "policy": dict(self.policy),
        }


class PluginSpec(Declaration):
    """A plugin's manifest. Constructing one checks what it says; registering it checks it against the tool registry."""

    key: Annotated[str, pattern(_KEY_RE.pattern, "must be lower-case letters, digits and '-' (e.g. 'order-desk')")]
    name: Annotated[str, text(nullable=False)]
    version: Annotated[str, pattern(_VERSION_RE.pattern, "must look like 1.2.0")]
    description: str = ""
    tools: tuple[PluginTool, ...] = ()
    presets: tuple[AgentPreset, ...] = ()
    scopes: tuple[Annotated[str, text(nullable=False)], ...] = ()
    hosts: tuple[Annotated[str, text(nullable=False)], ...] = ()
    config_schema: Annotated[dict[str, Any], json_object("must be a JSON Schema object")] = {"type": "object", "properties": {}}
    requires_install: Flag = True
    #: Where it came from: ``builtin`` or ``entry_point:<distribution>``; set by the catalog.
    source: Annotated[str, text(nullable=False)] = "builtin"

    @classmethod
    def _where(cls, data: Mapping[str, Any]) -> str:
        return f"plugin {data.get('key')!r}"

    @field_validator("config_schema")
    @classmethod
    def _a_json_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        if (wrong := schemas.invalid(schema)) is not None:
            raise problem(wrong[1])
        return schema

    @field_validator("presets")
    @classmethod
    def _slugs_once(cls, presets: tuple[AgentPreset, ...]) -> tuple[AgentPreset, ...]:
        slugs = [p.slug for p in presets]
        twice = [f"$[{i}].slug: {slug!r} is declared twice" for i, slug in enumerate(slugs) if slug in slugs[:i]]
        if twice:
            raise problems_of(twice)
        return presets

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> PluginSpec:
        found: list[str] = []
        if not self.requires_install and (self.scopes or self.hosts):
            found.append("$.requires_install: a plugin that needs scopes or outbound hosts must require an install "
                         "(an owner has to consent to them)")
        registry = (info.context or {}).get("registry")
        if registry is not None:
            found += _registry_problems(self, registry)
        if found:
            raise problems_of(found)
        return self

    def tool_keys(self) -> list[str]:
        return [t.key for t in self.tools]

    def as_row(self, registry: Any) -> dict[str, Any]:
        """The ``Plugin`` row's fields (everything but key and version)."""
        return {
            "name": self.name, "description": self.description, "source": self.source,
            "tools": [t.as_json(registry) for t in self.tools], "presets": [p.as_json() for p in self.presets],
            "scopes": sorted(self.scopes), "hosts": sorted(self.hosts), "config_schema": dict(self.config_schema),
            "requires_install": self.requires_install,
        }


def _registry_problems(spec: PluginSpec, registry: Any) -> list[str]:
    """What the tool registry says of the declaration: unknown tools, clashing names, presets naming absent tools."""
    found: list[str] = []
    names: dict[str, str] = {}
    for i, ref in enumerate(spec.tools):
        if ref.key not in registry:
            found.append(f"$.tools[{i}].key: {ref.key!r} is not a registered Python tool (missing @tool?)")
            continue
        name = registry.get(ref.key).name
        if name in names:
            found.append(f"$.tools[{i}]: tools {names[name]!r} and {ref.key!r} are both named {name!r}")
        names.setdefault(name, ref.key)
    for i, preset in enumerate(spec.presets):
        missing = [t for t in preset.tools if t not in names]
        if missing:
            found.append(f"$.presets[{i}].tools: names tool(s) {', '.join(missing)} the plugin does not provide; "
                         f"its tools are {', '.join(sorted(names)) or 'none'}")
    return found


def validate_spec(spec: PluginSpec, registry: Any) -> None:
    """Refuse a declaration that could not be installed, listing every problem with its path."""
    found = declaration_problems(PluginSpec, spec.model_dump(exclude_unset=True), {"registry": registry})[1]
    if found:
        raise PluginDeclarationError(found, f"plugin {spec.key!r}")


class PluginCatalog:
    """Explicit registry of plugins by key. One version per key: the one the running code provides."""

    def __init__(self, tool_registry: Any = None) -> None:
        self._plugins: dict[str, PluginSpec] = {}
        self._frozen = False
        self._lock = threading.Lock()
        self._tool_registry = tool_registry
        #: Entry points that failed to load: ``(name, message)``; shown by ``sync_plugins``.
        self.load_errors: list[tuple[str, str]] = []

    @property
    def tool_registry(self) -> Any:
        if self._tool_registry is None:
            return python_tools
        return self._tool_registry

    def register(self, spec: PluginSpec) -> PluginSpec:
        validate_spec(spec, self.tool_registry)
        with self._lock:
            if self._frozen:
                raise CatalogFrozenError(f"cannot register plugin {spec.key!r}: the catalog is frozen (plugins register at start-up)")
            existing = self._plugins.get(spec.key)
            if existing is not None and existing != spec:
                raise PluginDeclarationError(f"plugin key {spec.key!r} is already registered (from {existing.source}).")
            self._plugins[spec.key] = spec
        return spec

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[PluginSpec]:
        """Register every plugin that installed packages declare. A broken one is logged and skipped."""
        loaded: list[PluginSpec] = []
        for ep in metadata.entry_points(group=group):
            dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
            try:
                for spec in _specs_from(ep.load()):
                    loaded.append(self.register(_with_source(spec, f"entry_point:{dist}")))
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                log.error("plugin entry point %s (%s) could not be loaded: %s", ep.name, dist, message)
                self.load_errors.append((f"{ep.name} ({dist})", message))
        return loaded

    def freeze(self) -> None:
        with self._lock:
            self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    def get(self, key: str) -> PluginSpec:
        try:
            return self._plugins[key]
        except KeyError:
            known = ", ".join(sorted(self._plugins)) or "none"
            raise LookupError(f"No plugin {key!r} in the catalog. Known plugins: {known}.") from None

    def __contains__(self, key: object) -> bool:
        return key in self._plugins

    def __iter__(self) -> Iterator[PluginSpec]:
        return iter(sorted(self._plugins.values(), key=lambda s: s.key))

    def __len__(self) -> int:
        return len(self._plugins)


def _specs_from(obj: Any) -> Iterable[PluginSpec]:
    if callable(obj) and not isinstance(obj, PluginSpec):
        obj = obj()
    if isinstance(obj, PluginSpec):
        return [obj]
    if isinstance(obj, list | tuple) and all(isinstance(o, PluginSpec) for o in obj):
        return list(obj)
    raise PluginDeclarationError(f"an agentops.plugins entry point must give a PluginSpec (or a list of them), not {type(obj).__name__}")


def _with_source(spec: PluginSpec, source: str) -> PluginSpec:
    return spec.model_copy(update={"source": source})


#: The process-wide catalog, filled and frozen in ``MarketplaceConfig.ready()``.
catalog = PluginCatalog()
