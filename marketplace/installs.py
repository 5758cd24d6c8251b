"""Plugin installs: install, upgrade, consent, disable, enable, uninstall, configure, and agents from presets.

Keyword arguments, an explicit actor, one atomic transaction, the audit row written in it. The role checks repeat
the callers' on purpose: every door into a change is checked the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from agents import services as agent_services
from agents.models import Agent, AgentVersion
from audit.services import record_change
from marketplace.catalog import PluginCatalog, catalog
from marketplace.errors import (
    InvalidConfig,
    MarketplaceError,
    PluginNotInstalled,
    acting_with_user,
    require,
)
from marketplace.models import (
    InstallStatus,
    Plugin,
    PluginInstall,
    PresetAgent,
)
from runtime import schemas
from tenants.models import Tenant
from tenants.scoping import Actor
from tools.models import Tool, ToolKind
from tools.services import install_python_tool

log = logging.getLogger(__name__)


def config_errors(schema: Mapping[str, Any], config: Any) -> list[str]:
    """Readable schema violations, each naming the field (``refund_limit: -1 is less than the minimum of 0``)."""
    try:
        found = sorted(schemas.problems_of(dict(schema), config), key=lambda e: [str(p) for p in e.absolute_path])
    except schemas.CheckError as exc:
        return [f"(configuration): could not be checked against the plugin's settings schema: {exc}."]
    errors = []
    for error in found:
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


def _apply_tools(install: PluginInstall, plugin: Plugin, who: Actor) -> list[str]:
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
        install_python_tool(tenant=install.tenant, key=entry["key"], actor=who, plugin_install=install,
                            requires_approval=bool(entry.get("requires_approval")), **overrides)
    dropped = list(Tool.objects.filter(plugin_install=install).exclude(name__in=names))
    for tool in dropped:
        record_change(tenant=install.tenant, actor=who, action="tool.deleted", target=tool,
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
def install_plugin(*, tenant: Tenant, plugin_key: str, actor: Actor | None, config: dict[str, Any] | None = None) -> PluginInstall:
    """Install the catalog's current version in a tenant, or refresh an existing install of that version.

    An owner's install grants the plugin's scopes and hosts. Anyone else's install of a plugin that
    needs scopes or hosts waits (``pending_consent``, no tools yet) until an owner accepts.
    """
    who, user = acting_with_user(actor)
    require(who, "operate", tenant.pk, "install plugins")
    plugin = plugin_row(plugin_key)
    install = PluginInstall.objects.select_for_update().filter(tenant=tenant, plugin_key=plugin.key).first()
    if install is not None:
        if install.status != InstallStatus.INSTALLED or install.plugin_id != plugin.pk:
            raise MarketplaceError(f"{plugin.key} is already installed here ({install.version or 'not consented'}, "
                                   f"{install.get_status_display().lower()}); upgrade, enable or accept it instead.", field="plugin")
        install.config = validated_config(plugin, install.config if config is None else config)
        install.updated_by = user
        install.save()
        tools = _apply_tools(install, plugin, who)
        record_change(tenant=tenant, actor=who, action="plugin.refreshed", target=install,
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
        record_change(tenant=tenant, actor=who, action="plugin.install_pending_consent", target=install,
                      details={"plugin": plugin.key, "version": plugin.version, "scopes": plugin.scopes, "hosts": plugin.hosts})
        return install
    _grant(install, plugin, user)
    install.save()
    tools = _apply_tools(install, plugin, who)
    record_change(tenant=tenant, actor=who, action="plugin.installed", target=install,
                  details={"plugin": plugin.key, "version": plugin.version, "tools": tools,
                           "scopes": plugin.scopes, "hosts": plugin.hosts})
    return install


@transaction.atomic
def upgrade_plugin(*, install: PluginInstall, actor: Actor | None, config: dict[str, Any] | None = None) -> PluginInstall:
    """Move an install to the catalog's current version.

    If that version adds scopes, outbound hosts or tools, the upgrade waits for an owner
    (``pending_consent``): the installed version keeps working and the new tools do not exist yet.
    """
    who, user = acting_with_user(actor)
    require(who, "operate", install.tenant_id, "upgrade plugins")
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
        record_change(tenant=install.tenant, actor=who, action="plugin.upgrade_pending_consent", target=install,
                      details={"plugin": target.key, "from": previous, "to": target.version, "new": new})
        return install
    _grant(install, target, user)
    install.save()
    tools = _apply_tools(install, target, who)
    record_change(tenant=install.tenant, actor=who, action="plugin.upgraded", target=install,
                  details={"plugin": target.key, "from": previous, "to": target.version, "tools": tools})
    return install


@transaction.atomic
def accept_consent(*, install: PluginInstall, actor: Actor | None) -> PluginInstall:
    """An owner grants the waiting version's scopes, hosts and tools; its tools become available."""
    who, user = acting_with_user(actor)
    require(who, "own", install.tenant_id, "consent to a plugin's scopes, hosts and tools")
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
    tools = _apply_tools(install, target, who)
    record_change(tenant=install.tenant, actor=who, action="plugin.consent_accepted", target=install,
                  details={"plugin": target.key, "from": previous, "to": target.version, "granted": new, "tools": tools})
    return install


@transaction.atomic
def disable_plugin(*, install: PluginInstall, actor: Actor | None) -> PluginInstall:
    """Its tools become unavailable at once (the next call is refused); nothing is deleted."""
    who, user = acting_with_user(actor)
    require(who, "operate", install.tenant_id, "disable plugins")
    install = _locked(install)
    if install.status != InstallStatus.DISABLED:
        previous = install.status
        install.status, install.updated_by = InstallStatus.DISABLED, user
        install.save()
        record_change(tenant=install.tenant, actor=who, action="plugin.disabled", target=install,
                      details={"plugin": install.plugin_key, "was": previous})
    return install


@transaction.atomic
def enable_plugin(*, install: PluginInstall, actor: Actor | None) -> PluginInstall:
    who, user = acting_with_user(actor)
    require(who, "operate", install.tenant_id, "enable plugins")
    install = _locked(install)
    if install.status == InstallStatus.DISABLED:
        waiting = install.pending_plugin_id is not None or install.plugin_id is None
        install.status = InstallStatus.PENDING_CONSENT if waiting else InstallStatus.INSTALLED
        install.updated_by = user
        install.save()
        record_change(tenant=install.tenant, actor=who, action="plugin.enabled", target=install,
                      details={"plugin": install.plugin_key, "status": install.status})
    return install


@transaction.atomic
def uninstall_plugin(*, install: PluginInstall, actor: Actor | None) -> None:
    """Remove the install and the tools it provided. Agents made from its presets stay, but cannot run."""
    who, _ = acting_with_user(actor)
    require(who, "operate", install.tenant_id, "uninstall plugins")
    install = _locked(install)
    tools = sorted(Tool.objects.filter(plugin_install=install).values_list("name", flat=True))
    record_change(tenant=install.tenant, actor=who, action="plugin.uninstalled", target=install,
                  details={"plugin": install.plugin_key, "version": install.version, "tools_removed": tools})
    Tool.objects.filter(plugin_install=install).delete()
    install.delete()


@transaction.atomic
def configure_plugin(*, install: PluginInstall, config: dict[str, Any], actor: Actor | None) -> PluginInstall:
    who, user = acting_with_user(actor)
    require(who, "operate", install.tenant_id, "configure plugins")
    install = _locked(install)
    plugin = install.plugin or install.pending_plugin
    assert plugin is not None
    cleaned = validated_config(plugin, config)
    changed = sorted(k for k in set(cleaned) | set(install.config) if cleaned.get(k) != install.config.get(k))
    if changed:
        install.config, install.updated_by = cleaned, user
        install.save()
        # Only the names: a configuration may hold values that do not belong in the audit log.
        record_change(tenant=install.tenant, actor=who, action="plugin.configured", target=install,
                      details={"plugin": install.plugin_key, "changed": changed})
    return install


@transaction.atomic
def create_agent_from_preset(*, tenant: Tenant, plugin_key: str, preset_slug: str, actor: Actor | None,
                             slug: str | None = None, name: str | None = None) -> Agent:
    """A new agent (and its v1) from a plugin's preset. The tenant must have the plugin installed."""
    who, user = acting_with_user(actor)
    require(who, "operate", tenant.pk, "create agents")
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
    agent = agent_services.set_current_version(actor=who, agent=agent, version=version,  # the one way, through the gate
                                               reason=f"preset {plugin_key}/{preset_slug}")
    PresetAgent.objects.create(tenant=tenant, agent=agent, plugin_key=plugin_key, preset_slug=preset_slug)
    record_change(tenant=tenant, actor=who, action="agent.created_from_preset", target=agent,
                  details={"plugin": plugin_key, "version": install.plugin.version, "preset": preset_slug})
    return agent
