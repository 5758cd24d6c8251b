"""The plugin catalog: plugins declared in code, in an explicit registry frozen after start-up.

Built-in plugins register themselves from ``marketplace.builtin``; third-party packages expose a
:class:`PluginSpec` (or a callable returning one, or a list of them) through the ``agentops.plugins``
entry-point group::

    # pyproject.toml of a plugin package
    [project.entry-points."agentops.plugins"]
    weather = "agentops_weather:PLUGIN"

The database mirrors the catalog (a ``Plugin`` row per key + version, written by ``sync_plugins``
and after ``migrate``); nothing here touches the database.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from tools.pyfunc import registry as python_tools
from tools.rate_limits import value_problem

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agentops.plugins"
_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_VERSION_RE = re.compile(r"^\d+(\.\d+){0,3}([.-]?[A-Za-z0-9]+)?$")
#: The Tool fields a plugin may set per tool besides ``requires_approval`` (anything else is a declaration error).
TOOL_OVERRIDE_FIELDS = frozenset({
    "category", "idempotent", "required_scopes", "timeout_seconds", "result_fields",
    "summary_template", "result_size_cap", "sensitive_fields", "description",
    "rate_limit_per_minute",  # calls per minute per tenant; a floor: a tenant may lower it, never raise or remove it
})


class PluginDeclarationError(ValueError):
    """A plugin's declaration is inconsistent; the message names the plugin and the field."""


class CatalogFrozenError(RuntimeError):
    """A plugin was registered after start-up."""


@dataclass(frozen=True)
class PluginTool:
    """One Python tool (a key of ``tools.pyfunc.registry``) a plugin provides, with per-tool overrides."""

    key: str
    requires_approval: bool = False
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self, registry: Any) -> dict[str, Any]:
        spec = registry.get(self.key)
        return {
            "key": self.key, "name": spec.name, "category": self.overrides.get("category", spec.category),
            "requires_approval": self.requires_approval, "overrides": dict(self.overrides),
        }


@dataclass(frozen=True)
class AgentPreset:
    """A ready-made agent: what its first version is made of."""

    slug: str
    name: str
    system_prompt: str
    model: str
    tools: tuple[str, ...] = ()
    policy: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "slug": self.slug, "name": self.name, "description": self.description, "system_prompt": self.system_prompt,
            "model": self.model, "tools": list(self.tools), "policy": dict(self.policy),
        }


@dataclass(frozen=True)
class PluginSpec:
    key: str
    name: str
    version: str
    description: str = ""
    tools: tuple[PluginTool, ...] = ()
    presets: tuple[AgentPreset, ...] = ()
    scopes: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    config_schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    requires_install: bool = True
    #: Where it came from: ``builtin`` or ``entry_point:<distribution>``; set by the catalog.
    source: str = "builtin"

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


def validate_spec(spec: PluginSpec, registry: Any) -> None:
    """Refuse a declaration that could not be installed, with a message naming what is wrong."""
    where = f"plugin {spec.key!r}"
    if not _KEY_RE.match(spec.key):
        raise PluginDeclarationError(f"{where}: key must be lower-case letters, digits and '-' (e.g. 'order-desk').")
    if not _VERSION_RE.match(spec.version):
        raise PluginDeclarationError(f"{where}: version {spec.version!r} must look like 1.2.0.")
    names: dict[str, str] = {}
    for ref in spec.tools:
        if ref.key not in registry:
            raise PluginDeclarationError(f"{where}: tool {ref.key!r} is not a registered Python tool (missing @tool?).")
        unknown = set(ref.overrides) - TOOL_OVERRIDE_FIELDS
        if unknown:
            raise PluginDeclarationError(f"{where}: tool {ref.key!r} overrides unknown field(s) {', '.join(sorted(unknown))}; "
                                         f"allowed: {', '.join(sorted(TOOL_OVERRIDE_FIELDS))}.")
        if "rate_limit_per_minute" in ref.overrides:
            problem = value_problem(ref.overrides["rate_limit_per_minute"])
            if problem:
                raise PluginDeclarationError(f"{where}: tool {ref.key!r} rate_limit_per_minute: {problem}")
        name = registry.get(ref.key).name
        if name in names:
            raise PluginDeclarationError(f"{where}: tools {names[name]!r} and {ref.key!r} are both named {name!r}.")
        names[name] = ref.key
    slugs = set()
    for preset in spec.presets:
        if preset.slug in slugs:
            raise PluginDeclarationError(f"{where}: preset slug {preset.slug!r} is declared twice.")
        slugs.add(preset.slug)
        missing = [t for t in preset.tools if t not in names]
        if missing:
            raise PluginDeclarationError(f"{where}: preset {preset.slug!r} names tool(s) {', '.join(missing)} the plugin does not "
                                         f"provide; its tools are {', '.join(sorted(names)) or 'none'}.")
    try:
        Draft202012Validator.check_schema(dict(spec.config_schema))
    except SchemaError as exc:
        raise PluginDeclarationError(f"{where}: config_schema is not a valid JSON Schema: {exc.message}") from None
    if not spec.requires_install and (spec.scopes or spec.hosts):
        raise PluginDeclarationError(f"{where}: a plugin that needs scopes or outbound hosts must require an install "
                                     "(an owner has to consent to them).")


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
    from dataclasses import replace

    return replace(spec, source=source)


#: The process-wide catalog, filled and frozen in ``MarketplaceConfig.ready()``.
catalog = PluginCatalog()
