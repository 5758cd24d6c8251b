"""Marketplace and release state changes: keyword arguments, an explicit acting user, one atomic
transaction, the audit row written in it. Admin actions, viewsets and tasks call these.

``actor`` is a user, an :class:`~tenants.scoping.Actor`, or ``None`` for the system (migrations,
the periodic release guard). The role checks here repeat the callers' on purpose: every door
into a change is checked the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from jsonschema import Draft202012Validator

from agents.models import Agent, AgentVersion, Run, RunStatus
from audit.services import record_change
from marketplace.catalog import PluginCatalog, catalog
from marketplace.models import (
    GuardMetric,
    InstallStatus,
    Plugin,
    PluginInstall,
    PresetAgent,
    ReleaseGuard,
    ReleaseWeight,
    ToolRollout,
)
from marketplace.release import weight_errors
from tenants.models import Tenant
from tenants.scoping import Actor, actor_for_user
from tools.models import Tool, ToolKind
from tools.services import install_python_tool

log = logging.getLogger(__name__)

SYSTEM = Actor(is_superuser=True)
#: Terminal reasons that count as errors for the release guard.
ERROR_REASONS = ("error", "timeout")


class MarketplaceError(Exception):
    """A refused change; the message says what was wrong and what to do. ``field`` names the input at fault."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class NotAllowed(MarketplaceError):
    pass


class PluginNotInstalled(MarketplaceError):
    pass


class InvalidConfig(MarketplaceError):
    def __init__(self, message: str, *, errors: list[str]) -> None:
        super().__init__(message, field="config")
        self.errors = errors


class InvalidWeights(MarketplaceError):
    def __init__(self, errors: list[str]) -> None:
        super().__init__(" ".join(errors), field="weights")
        self.errors = errors


# --------------------------------------------------------------------------- helpers


def _acting(actor: Any) -> tuple[Actor, Any]:
    """(Actor for role checks, user for the audit row)."""
    if actor is None:
        return SYSTEM, None
    if isinstance(actor, Actor):
        return actor, actor.user
    return actor_for_user(actor), actor


def _require(actor: Actor, action: str, tenant_id: int, doing: str) -> None:
    if not actor.can(action, tenant_id):
        role = {"own": "an owner", "operate": "an operator or owner", "approve": "an approver or owner"}.get(action, action)
        raise NotAllowed(f"Only {role} of this tenant may {doing}.")


def config_errors(schema: Mapping[str, Any], config: Any) -> list[str]:
    """Readable schema violations, each naming the field (``refund_limit: -1 is less than the minimum of 0``)."""
    validator = Draft202012Validator(dict(schema))
    errors = []
    for error in sorted(validator.iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path]):
        where = ".".join(str(p) for p in error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = sorted((error.schema.get("properties") or {}).keys())
            extra = sorted(set(error.instance) - set(allowed))
            for name in extra:
                path = f"{where}.{name}" if where else name
                errors.append(f"{path}: unknown setting; allowed settings are {', '.join(allowed) or 'none'}.")
            continue
        if error.validator == "required":
            errors.append(f"{where + ': ' if where else ''}{error.message}.")
            continue
        errors.append(f"{where or '(configuration)'}: {error.message}.")
    return errors


def validated_config(plugin: Plugin, config: Any) -> dict[str, Any]:
    """The configuration with the schema's top-level defaults filled in, or InvalidConfig naming each bad field."""
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise InvalidConfig(f"The configuration of {plugin.key} must be a JSON object, not {type(config).__name__}.",
                            errors=["(configuration): must be an object"])
    filled = dict(config)
    for name, prop in (plugin.config_schema.get("properties") or {}).items():
        if name not in filled and isinstance(prop, dict) and "default" in prop:
            filled[name] = prop["default"]
    errors = config_errors(plugin.config_schema, filled)
    if errors:
        raise InvalidConfig(f"The configuration of {plugin.key} {plugin.version} is not valid: " + " ".join(errors), errors=errors)
    return filled


def plugin_row(spec_key: str, *, plugins: PluginCatalog | None = None) -> Plugin:
    """The stored row of the catalog's current version of a plugin (written now if the catalog was not synced yet)."""
    from marketplace.sync import store_spec

    source = plugins or catalog
    try:
        spec = source.get(spec_key)
    except LookupError as exc:
        raise MarketplaceError(str(exc), field="plugin") from None
    row = Plugin.objects.filter(key=spec.key, version=spec.version).first()
    return row or store_spec(spec, source.tool_registry)


def _apply_tools(install: PluginInstall, plugin: Plugin, user: Any) -> list[str]:
    """Create or refresh the tenant's Tool rows for the plugin version; remove the install's tools it dropped."""
    names = plugin.tool_names()
    existing = {t.name: t for t in Tool.objects.for_tenant(install.tenant_id).filter(name__in=names)}
    for entry in plugin.tools:
        other = existing.get(entry["name"])
        if other is None or other.plugin_install_id == install.pk:
            continue
        if other.plugin_install_id is not None:
            raise MarketplaceError(f"The tool name {entry['name']!r} is already used by another plugin in this tenant "
                                   f"({other.plugin_install}); uninstall that plugin first.", field="plugin")
        if other.kind != ToolKind.PYTHON or other.config.get("function") != entry["key"]:
            raise MarketplaceError(f"This tenant already has its own tool named {entry['name']!r}; rename or delete it "
                                   f"before installing {plugin.key}.", field="plugin")
        # The tenant's own row for the very same function: the plugin adopts it.
    for entry in plugin.tools:
        overrides = dict(entry.get("overrides") or {})
        own = existing.get(entry["name"])
        declared, kept = overrides.get("rate_limit_per_minute"), own.rate_limit_per_minute if own is not None else None
        if declared is not None and kept is not None and own.plugin_install_id == install.pk and kept < declared:
            overrides["rate_limit_per_minute"] = kept  # the tenant lowered the plugin's limit: a refresh keeps it lower
        install_python_tool(tenant=install.tenant, key=entry["key"], actor=user, plugin_install=install,
                            requires_approval=bool(entry.get("requires_approval")), **overrides)
    dropped = list(Tool.objects.filter(plugin_install=install).exclude(name__in=names))
    for tool in dropped:
        record_change(tenant=install.tenant, actor=user, action="tool.deleted", target=tool,
                      details={"reason": f"not part of {plugin.key} {plugin.version}"})
        tool.delete()
    return names


def _locked(install: PluginInstall) -> PluginInstall:
    return PluginInstall.objects.select_for_update(of=("self",)).select_related("tenant", "plugin", "pending_plugin").get(pk=install.pk)


def _new_permissions(install: PluginInstall, target: Plugin) -> dict[str, list[str]]:
    current_tools = set(install.plugin.tool_keys()) if install.plugin is not None else set()
    return {
        "scopes": sorted(set(target.scopes) - set(install.granted_scopes)),
        "hosts": sorted(set(target.hosts) - set(install.granted_hosts)),
        "tools": sorted(set(target.tool_keys()) - current_tools),
    }


def _grant(install: PluginInstall, plugin: Plugin, user: Any) -> None:
    install.plugin = plugin
    install.pending_plugin = None
    install.status = InstallStatus.INSTALLED
    install.granted_scopes = list(plugin.scopes)
    install.granted_hosts = list(plugin.hosts)
    if plugin.scopes or plugin.hosts:
        install.consented_by = user
        install.consented_at = timezone.now()


# --------------------------------------------------------------------------- installs


@transaction.atomic
def install_plugin(*, tenant: Tenant, plugin_key: str, actor: Any, config: dict[str, Any] | None = None) -> PluginInstall:
    """Install the catalog's current version in a tenant, or refresh an existing install of that version.

    An owner's install grants the plugin's scopes and hosts. Anyone else's install of a plugin that
    needs scopes or hosts waits (``pending_consent``, no tools yet) until an owner accepts.
    """
    who, user = _acting(actor)
    _require(who, "operate", tenant.pk, "install plugins")
    plugin = plugin_row(plugin_key)
    install = PluginInstall.objects.select_for_update().filter(tenant=tenant, plugin_key=plugin.key).first()
    if install is not None:
        if install.status != InstallStatus.INSTALLED or install.plugin_id != plugin.pk:
            raise MarketplaceError(f"{plugin.key} is already installed here ({install.version or 'not consented'}, "
                                   f"{install.get_status_display().lower()}); upgrade, enable or accept it instead.", field="plugin")
        install.config = validated_config(plugin, install.config if config is None else config)
        install.updated_by = user
        install.save()
        tools = _apply_tools(install, plugin, user)
        record_change(tenant=tenant, actor=user, action="plugin.refreshed", target=install,
                      details={"plugin": plugin.key, "version": plugin.version, "tools": tools})
        return install
    cleaned = validated_config(plugin, config)
    needs_consent = bool(plugin.scopes or plugin.hosts) and not who.can("own", tenant.pk)
    install = PluginInstall.objects.create(
        tenant=tenant, plugin_key=plugin.key, config=cleaned, installed_by=user, updated_by=user,
        status=InstallStatus.PENDING_CONSENT if needs_consent else InstallStatus.INSTALLED,
        pending_plugin=plugin if needs_consent else None,
    )
    if needs_consent:
        record_change(tenant=tenant, actor=user, action="plugin.install_pending_consent", target=install,
                      details={"plugin": plugin.key, "version": plugin.version, "scopes": plugin.scopes, "hosts": plugin.hosts})
        return install
    _grant(install, plugin, user)
    install.save()
    tools = _apply_tools(install, plugin, user)
    record_change(tenant=tenant, actor=user, action="plugin.installed", target=install,
                  details={"plugin": plugin.key, "version": plugin.version, "tools": tools,
                           "scopes": plugin.scopes, "hosts": plugin.hosts})
    return install


@transaction.atomic
def upgrade_plugin(*, install: PluginInstall, actor: Any, config: dict[str, Any] | None = None) -> PluginInstall:
    """Move an install to the catalog's current version.

    If that version adds scopes, outbound hosts or tools, the upgrade waits for an owner
    (``pending_consent``): the installed version keeps working and the new tools do not exist yet.
    """
    who, user = _acting(actor)
    _require(who, "operate", install.tenant_id, "upgrade plugins")
    install = _locked(install)
    if install.status == InstallStatus.DISABLED:
        raise MarketplaceError(f"{install.plugin_key} is disabled here; enable it before upgrading.", field="status")
    target = plugin_row(install.plugin_key)
    if install.plugin_id == target.pk:
        raise MarketplaceError(f"{install.plugin_key} is already at {target.version}, the newest version.", field="plugin")
    cleaned = validated_config(target, install.config if config is None else config)
    new = _new_permissions(install, target)
    previous = install.version
    install.config = cleaned
    install.updated_by = user
    if any(new.values()):
        install.pending_plugin = target
        install.status = InstallStatus.PENDING_CONSENT
        install.save()
        record_change(tenant=install.tenant, actor=user, action="plugin.upgrade_pending_consent", target=install,
                      details={"plugin": target.key, "from": previous, "to": target.version, "new": new})
        return install
    _grant(install, target, user)
    install.save()
    tools = _apply_tools(install, target, user)
    record_change(tenant=install.tenant, actor=user, action="plugin.upgraded", target=install,
                  details={"plugin": target.key, "from": previous, "to": target.version, "tools": tools})
    return install


@transaction.atomic
def accept_consent(*, install: PluginInstall, actor: Any) -> PluginInstall:
    """An owner grants the waiting version's scopes, hosts and tools; its tools become available."""
    who, user = _acting(actor)
    _require(who, "own", install.tenant_id, "consent to a plugin's scopes, hosts and tools")
    install = _locked(install)
    if install.status != InstallStatus.PENDING_CONSENT or install.pending_plugin is None:
        raise MarketplaceError(f"Nothing of {install.plugin_key} waits for consent here (it is "
                               f"{install.get_status_display().lower()}).", field="status")
    target = install.pending_plugin
    install.config = validated_config(target, install.config)
    new = _new_permissions(install, target)
    previous = install.version
    _grant(install, target, user)
    install.consented_by, install.consented_at = user, timezone.now()
    install.updated_by = user
    install.save()
    tools = _apply_tools(install, target, user)
    record_change(tenant=install.tenant, actor=user, action="plugin.consent_accepted", target=install,
                  details={"plugin": target.key, "from": previous, "to": target.version, "granted": new, "tools": tools})
    return install


@transaction.atomic
def disable_plugin(*, install: PluginInstall, actor: Any) -> PluginInstall:
    """Its tools become unavailable at once (the next call is refused); nothing is deleted."""
    who, user = _acting(actor)
    _require(who, "operate", install.tenant_id, "disable plugins")
    install = _locked(install)
    if install.status != InstallStatus.DISABLED:
        previous = install.status
        install.status, install.updated_by = InstallStatus.DISABLED, user
        install.save()
        record_change(tenant=install.tenant, actor=user, action="plugin.disabled", target=install,
                      details={"plugin": install.plugin_key, "was": previous})
    return install


@transaction.atomic
def enable_plugin(*, install: PluginInstall, actor: Any) -> PluginInstall:
    who, user = _acting(actor)
    _require(who, "operate", install.tenant_id, "enable plugins")
    install = _locked(install)
    if install.status == InstallStatus.DISABLED:
        waiting = install.pending_plugin_id is not None or install.plugin_id is None
        install.status = InstallStatus.PENDING_CONSENT if waiting else InstallStatus.INSTALLED
        install.updated_by = user
        install.save()
        record_change(tenant=install.tenant, actor=user, action="plugin.enabled", target=install,
                      details={"plugin": install.plugin_key, "status": install.status})
    return install


@transaction.atomic
def uninstall_plugin(*, install: PluginInstall, actor: Any) -> None:
    """Remove the install and the tools it provided. Agents made from its presets stay, but cannot run."""
    who, user = _acting(actor)
    _require(who, "operate", install.tenant_id, "uninstall plugins")
    install = _locked(install)
    tools = sorted(Tool.objects.filter(plugin_install=install).values_list("name", flat=True))
    record_change(tenant=install.tenant, actor=user, action="plugin.uninstalled", target=install,
                  details={"plugin": install.plugin_key, "version": install.version, "tools_removed": tools})
    Tool.objects.filter(plugin_install=install).delete()
    install.delete()


@transaction.atomic
def configure_plugin(*, install: PluginInstall, config: dict[str, Any], actor: Any) -> PluginInstall:
    who, user = _acting(actor)
    _require(who, "operate", install.tenant_id, "configure plugins")
    install = _locked(install)
    plugin = install.plugin or install.pending_plugin
    assert plugin is not None
    cleaned = validated_config(plugin, config)
    changed = sorted(k for k in set(cleaned) | set(install.config) if cleaned.get(k) != install.config.get(k))
    if changed:
        install.config, install.updated_by = cleaned, user
        install.save()
        # Only the names: a configuration may hold values that do not belong in the audit log.
        record_change(tenant=install.tenant, actor=user, action="plugin.configured", target=install,
                      details={"plugin": install.plugin_key, "changed": changed})
    return install


@transaction.atomic
def create_agent_from_preset(*, tenant: Tenant, plugin_key: str, preset_slug: str, actor: Any,
                             slug: str | None = None, name: str | None = None) -> Agent:
    """A new agent (and its v1) from a plugin's preset. The tenant must have the plugin installed."""
    who, user = _acting(actor)
    _require(who, "operate", tenant.pk, "create agents")
    install = PluginInstall.objects.select_related("plugin", "pending_plugin").filter(tenant=tenant, plugin_key=plugin_key).first()
    if install is None:
        spec_needs_install = plugin_key not in catalog or catalog.get(plugin_key).requires_install
        if spec_needs_install:
            raise PluginNotInstalled(
                f"The preset {preset_slug!r} belongs to the plugin {plugin_key!r}, which tenant {tenant.slug!r} has not installed. "
                "Install the plugin first (admin: Plugin installs → Add; API: POST /api/v1/plugin-installs).", field="plugin")
        install = install_plugin(tenant=tenant, plugin_key=plugin_key, actor=actor)
    if install.status == InstallStatus.DISABLED:
        raise PluginNotInstalled(f"The plugin {plugin_key!r} is disabled in tenant {tenant.slug!r}; enable it before using "
                                 "its presets.", field="plugin")
    if install.plugin is None:
        raise PluginNotInstalled(f"The plugin {plugin_key!r} waits for an owner's consent in tenant {tenant.slug!r}; "
                                 "its presets can be used once an owner accepts.", field="plugin")
    preset = install.plugin.preset(preset_slug)
    if preset is None:
        later = install.pending_plugin.preset(preset_slug) if install.pending_plugin is not None else None
        if later is not None:
            raise PluginNotInstalled(f"The preset {preset_slug!r} comes with {plugin_key} {install.pending_plugin.version}, "
                                     "which waits for an owner's consent.", field="preset")
        known = ", ".join(p["slug"] for p in install.plugin.presets) or "none"
        raise MarketplaceError(f"The plugin {plugin_key} {install.plugin.version} has no preset {preset_slug!r}; "
                               f"its presets are: {known}.", field="preset")
    agent_slug = slug or preset["slug"]
    if Agent.objects.for_tenant(tenant).filter(slug=agent_slug).exists():
        raise MarketplaceError(f"Tenant {tenant.slug!r} already has an agent {agent_slug!r}; choose another slug.", field="slug")
    agent = Agent.objects.create(tenant=tenant, slug=agent_slug, name=name or preset["name"],
                                 description=preset.get("description", ""))
    version = AgentVersion(
        tenant=tenant, agent=agent, number=1, model=preset["model"], system_prompt=preset["system_prompt"],
        tools=list(preset["tools"]), policy=dict(preset["policy"]), created_by=user,
        note=f"from preset {plugin_key}/{preset_slug} ({install.plugin.version})",
    )
    try:
        version.full_clean()  # the same checks as any new version (policy, tools present in the tenant)
    except ValidationError as exc:
        raise MarketplaceError(f"The preset {preset_slug!r} of {plugin_key} {install.plugin.version} does not make a valid "
                               f"agent version here: {'; '.join(exc.messages)}", field="preset") from None
    version.save()
    agent.current_version = version
    agent.save(update_fields=["current_version"])
    PresetAgent.objects.create(tenant=tenant, agent=agent, plugin_key=plugin_key, preset_slug=preset_slug)
    record_change(tenant=tenant, actor=user, action="agent.created_from_preset", target=agent,
                  details={"plugin": plugin_key, "version": install.plugin.version, "preset": preset_slug})
    return agent


# --------------------------------------------------------------------------- agent versions and release weights


def _version_number(agent: Agent, key: Any) -> int:
    if isinstance(key, AgentVersion):
        if key.agent_id != agent.pk:
            raise InvalidWeights([f"{key} is not a version of agent {agent.slug!r}."])
        return key.number
    text = str(key).lower().removeprefix("v")
    if not text.isdigit():
        raise InvalidWeights([f"Name versions by number (1 or v1); got {key!r}."])
    return int(text)


def _snapshot(agent: Agent) -> dict[str, int]:
    return {f"v{n}": w for n, w in ReleaseWeight.objects.filter(agent=agent).values_list("version__number", "weight")}


@transaction.atomic
def set_release_weights(*, agent: Agent, weights: Mapping[Any, int], actor: Any) -> list[ReleaseWeight]:
    """Replace an agent's release weights (keys: version numbers, "v2", or AgentVersion rows; values sum to 100).

    Takes effect for the next run: sessions are assigned by a stable hash, so a session keeps its
    version unless the weights move it. An empty mapping ends the release (runs use the current version).
    """
    who, user = _acting(actor)
    _require(who, "operate", agent.tenant_id, "change release weights")
    agent = Agent.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=agent.pk)
    by_number = {_version_number(agent, k): w for k, w in weights.items()}
    versions = {v.number: v for v in agent.versions.all()}
    errors = weight_errors(by_number, known_numbers=list(versions), agent_slug=agent.slug)
    if by_number and agent.current_version_id is None and not errors:
        errors.append(f"Agent {agent.slug!r} has no current (stable) version; set one before a gray release.")
    if errors:
        raise InvalidWeights(errors)
    previous = _snapshot(agent)
    existing = {r.version_id: r for r in ReleaseWeight.objects.filter(agent=agent)}
    now = timezone.now()
    kept = []
    for number, weight in sorted(by_number.items()):
        version = versions[number]
        row = existing.pop(version.pk, None)
        if row is None:
            row = ReleaseWeight(tenant_id=agent.tenant_id, agent=agent, version=version, weight=0)
        if weight > 0 and row.weight == 0:
            row.live_since = now
        row.weight, row.updated_by = weight, user
        row.save()
        kept.append(row)
    ReleaseWeight.objects.filter(pk__in=[r.pk for r in existing.values()]).delete()
    record_change(tenant=agent.tenant, actor=user, action="release.weights_set", target=agent,
                  details={"weights": _snapshot(agent), "previous": previous})
    return kept


@transaction.atomic
def rollback_version(*, agent: Agent, version: AgentVersion, actor: Any, reason: str = "",
                     details: dict[str, Any] | None = None) -> ReleaseWeight | None:
    """Instant rollback: the version's weight goes to 0 and its share to the stable (current) version.

    Takes effect on the next run. Returns the stable version's row, or None if the version had no share.
    """
    who, user = _acting(actor)
    _require(who, "operate", agent.tenant_id, "roll back releases")
    agent = Agent.objects.select_for_update(of=("self",)).select_related("tenant", "current_version").get(pk=agent.pk)
    if version.agent_id != agent.pk:
        raise MarketplaceError(f"{version} is not a version of agent {agent.slug!r}.", field="version")
    stable = agent.current_version
    if stable is None or stable.pk == version.pk:
        raise MarketplaceError(f"v{version.number} is the stable version of {agent.slug!r}, so there is nothing to roll back "
                               "to; make another version current first.", field="version")
    row = ReleaseWeight.objects.filter(agent=agent, version=version).first()
    if row is None or row.weight == 0:
        return None
    previous = _snapshot(agent)
    moved = row.weight
    row.weight, row.updated_by = 0, user
    row.save()
    stable_row, _ = ReleaseWeight.objects.get_or_create(agent=agent, version=stable,
                                                        defaults={"tenant_id": agent.tenant_id, "weight": 0})
    if stable_row.weight == 0:
        stable_row.live_since = timezone.now()
    stable_row.weight += moved
    stable_row.updated_by = user
    stable_row.save()
    record_change(tenant=agent.tenant, actor=user, action="release.rolled_back", target=agent,
                  details={"version": version.number, "to": stable.number, "moved": moved, "reason": reason or "manual",
                           "automatic": actor is None, "previous": previous, "weights": _snapshot(agent), **(details or {})})
    return stable_row


@transaction.atomic
def set_release_guard(*, agent: Agent, metric: str, threshold: float, actor: Any, window: int = 50, min_runs: int = 10,
                      enabled: bool = True) -> ReleaseGuard:
    who, user = _acting(actor)
    _require(who, "operate", agent.tenant_id, "change release guards")
    if metric not in GuardMetric.values:
        raise MarketplaceError(f"metric must be one of {', '.join(GuardMetric.values)}; got {metric!r}.", field="metric")
    if threshold < 0 or (metric != GuardMetric.COST_PER_RUN and threshold > 1):
        raise MarketplaceError("threshold must be a fraction from 0 to 1 for a rate (0.2 = 20 %), or ≥ 0 for a cost.", field="threshold")
    if window < 1 or not 1 <= min_runs <= window:
        raise MarketplaceError(f"window must be ≥ 1 and min_runs between 1 and window; got window {window}, min_runs {min_runs}.",
                               field="min_runs")
    guard, created = ReleaseGuard.objects.update_or_create(
        agent=agent, metric=metric,
        defaults={"tenant_id": agent.tenant_id, "threshold": threshold, "window": window, "min_runs": min_runs,
                  "enabled": enabled, "updated_by": user},
    )
    record_change(tenant=agent.tenant, actor=user, action="release.guard_created" if created else "release.guard_changed",
                  target=guard, details={"metric": metric, "threshold": threshold, "window": window, "min_runs": min_runs,
                                         "enabled": enabled})
    return guard


def guard_value(metric: str, runs: list[tuple[str, Any]]) -> float:
    """The metric over (terminal_reason, usage) pairs of finished runs."""
    if not runs:
        return 0.0
    if metric == GuardMetric.ERROR_RATE:
        return sum(reason in ERROR_REASONS for reason, _ in runs) / len(runs)
    if metric == GuardMetric.REJECTION_RATE:
        return sum(reason == "rejected" for reason, _ in runs) / len(runs)
    total = 0.0
    for _, usage in runs:
        try:
            total += float((usage or {}).get("cost") or 0)
        except (TypeError, ValueError):
            continue
    return total / len(runs)


@dataclass(frozen=True)
class GuardTrip:
    agent_id: int
    version: int
    metric: str
    value: float
    threshold: float
    runs: int


def check_release_guards(*, agent_ids: list[int] | None = None) -> list[GuardTrip]:
    """Roll back every candidate version whose guard metric is above its threshold. Idempotent; run it often.

    A candidate is a version with weight > 0 that is not the agent's current (stable) version. Only
    its finished runs since its weight last went above 0 count, at most ``window`` of them, and no
    decision is taken before ``min_runs``.
    """
    guards = ReleaseGuard.objects.filter(enabled=True).select_related("agent")
    if agent_ids is not None:
        guards = guards.filter(agent_id__in=agent_ids)
    trips: list[GuardTrip] = []
    now = timezone.now()
    for guard in guards:
        agent = guard.agent
        candidates = (ReleaseWeight.objects.filter(agent=agent, weight__gt=0).exclude(version_id=agent.current_version_id)
                      .select_related("version"))
        value = None
        for candidate in candidates:
            runs_qs = Run.objects.filter(agent=agent, version=candidate.version, status=RunStatus.FINISHED)
            if candidate.live_since is not None:
                runs_qs = runs_qs.filter(created_at__gte=candidate.live_since)
            runs = list(runs_qs.order_by("-finished_at", "-created_at").values_list("terminal_reason", "usage")[: guard.window])
            if len(runs) < guard.min_runs:
                continue
            value = guard_value(guard.metric, runs)
            if value <= guard.threshold:
                continue
            why = (f"{guard.get_metric_display()} of v{candidate.version.number} was {value:.3g} over its last {len(runs)} "
                   f"finished runs, above the guard's threshold {guard.threshold:g}")
            try:
                rolled = rollback_version(agent=agent, version=candidate.version, actor=None, reason=why,
                                          details={"guard": guard.pk, "metric": guard.metric, "value": value,
                                                   "threshold": guard.threshold, "runs": len(runs)})
            except MarketplaceError as exc:
                log.warning("release guard %s could not roll back %s: %s", guard.pk, candidate.version, exc)
                continue
            if rolled is not None:
                log.warning("release guard rolled back %s: %s", candidate.version, why)
                trips.append(GuardTrip(agent.pk, candidate.version.number, guard.metric, value, guard.threshold, len(runs)))
                ReleaseGuard.objects.filter(pk=guard.pk).update(last_tripped_at=now)
        ReleaseGuard.objects.filter(pk=guard.pk).update(last_checked_at=now, last_value=value)
    return trips


# --------------------------------------------------------------------------- tools


@transaction.atomic
def set_tool_rollout(*, tool: Tool, enabled_percent: int | None, actor: Any) -> ToolRollout | None:
    """Release a tool to this share of sessions (sticky per session); ``None`` removes the gray release (everyone)."""
    who, user = _acting(actor)
    _require(who, "operate", tool.tenant_id, "change tool rollouts")
    previous = ToolRollout.objects.filter(tool=tool).values_list("enabled_percent", flat=True).first()
    if enabled_percent is None:
        ToolRollout.objects.filter(tool=tool).delete()
        rollout = None
    else:
        if isinstance(enabled_percent, bool) or not isinstance(enabled_percent, int) or not 0 <= enabled_percent <= 100:
            raise MarketplaceError(f"enabled_percent must be a whole number from 0 to 100; got {enabled_percent!r}.",
                                   field="enabled_percent")
        rollout, _ = ToolRollout.objects.update_or_create(
            tool=tool, defaults={"tenant_id": tool.tenant_id, "enabled_percent": enabled_percent, "updated_by": user})
    record_change(tenant=tool.tenant, actor=user, action="tool.rollout_set", target=tool,
                  details={"enabled_percent": enabled_percent, "previous": previous})
    return rollout
