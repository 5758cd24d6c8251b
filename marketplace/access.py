"""What the agents layer asks the marketplace: which tools a tenant may resolve, whether a tool is
released to a session, which scopes the plugin installs were granted. Registered in ``agents.hooks``
at start-up (``MarketplaceConfig.ready()``). Read-only; no audit rows here (the gateway audits the call).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from marketplace.models import ACTIVE_INSTALL_STATUSES, PluginInstall
from marketplace.release import bucket
from tools.models import Tool

_PLUGIN_LIVE = Q(plugin_install__status__in=ACTIVE_INSTALL_STATUSES) & Q(plugin_install__plugin__isnull=False) & Q(
    plugin_install__plugin__available=True
)


def resolvable_tools(tenant_id: int) -> QuerySet[Tool]:
    """The Tool rows a tenant's agents may resolve: its own tools, plus the tools of plugins that are
    installed, enabled and consented (an upgrade waiting for consent keeps its previous tools; its new
    ones do not exist yet). Switched-off tools are included so the gateway can say so: check ``enabled``.
    """
    return Tool.objects.for_tenant(tenant_id).filter(Q(plugin_install__isnull=True) | _PLUGIN_LIVE)


def tool_allowed_for(tool: Tool, tenant_id: int, session_key: Any, *, as_read: bool = False) -> tuple[bool, str]:
    """Whether this session may call the tool now, and if not, a reason the model can read.

    Checks, in order: the tenant, the kill switch, the plugin install, and the tool's gray release
    (enabled for N % of sessions, sticky per session: a stable hash of tenant + tool + session).
    One query; none with ``as_read``: the caller read ``tool`` just now, before this call, with its install, plugin
    and rollout (``agents.hooks.callable_tools``), so the row it holds is as fresh as a read here would be (a flow's
    node task reads its tool right before calling it). A tool read without them is read here, as without the flag.
    """
    if tool.tenant_id != tenant_id:
        return False, f"There is no tool named {tool.name!r} here."
    row = _row_as_read(tool) if as_read else None
    if row is None:
        row = _policy_row(tool.pk)
    if row is None:
        return False, f"The tool {tool.name} no longer exists. Do not retry it."
    if not row["enabled"]:
        return False, f"The tool {tool.name} is switched off by an operator. Do not retry it; tell the user it is unavailable."
    if row["plugin_install_id"] is not None:
        live = (row["plugin_install__status"] in ACTIVE_INSTALL_STATUSES and row["plugin_install__plugin_id"] is not None
                and row["plugin_install__plugin__available"])
        if not live:
            return False, (f"The tool {tool.name} comes from the plugin {row['plugin_install__plugin_key']}, which is not enabled "
                           "in this tenant. Do not retry it; tell the user it is unavailable.")
    percent = row["rollout__enabled_percent"]
    if percent is not None and bucket(tenant_id, session_key, salt=f"tool:{tool.name}") >= percent:
        return False, (f"The tool {tool.name} is not available in this conversation yet (it is being rolled out gradually). "
                       "Do not retry it; answer without it.")
    return True, ""


_POLICY_FIELDS = ("enabled", "plugin_install_id", "plugin_install__status", "plugin_install__plugin_id",
                  "plugin_install__plugin__available", "plugin_install__plugin_key", "rollout__enabled_percent")


def _policy_query(pk: Any) -> QuerySet[Tool, dict[str, Any]]:
    return Tool.objects.filter(pk=pk).values(*_POLICY_FIELDS).order_by("pk")[:1]


def _row_as_read(tool: Tool) -> dict[str, Any] | None:
    """What :func:`_policy_row` reads, from a tool loaded with its install, plugin and rollout (None when it was not:
    then nothing here may trigger a query of its own)."""
    install_field, rollout = Tool._meta.get_field("plugin_install"), Tool._meta.get_field("rollout")
    if not rollout.is_cached(tool) or (tool.plugin_install_id is not None and not install_field.is_cached(tool)):
        return None
    install = tool.plugin_install if tool.plugin_install_id is not None else None
    if install is not None and install.plugin_id is not None and not type(install)._meta.get_field("plugin").is_cached(install):
        return None
    plugin = install.plugin if install is not None and install.plugin_id is not None else None
    release = rollout.get_cached_value(tool)
    return {
        "enabled": tool.enabled,
        "plugin_install_id": tool.plugin_install_id,
        "plugin_install__status": install.status if install is not None else None,
        "plugin_install__plugin_id": install.plugin_id if install is not None else None,
        "plugin_install__plugin__available": plugin.available if plugin is not None else None,
        "plugin_install__plugin_key": install.plugin_key if install is not None else None,
        "rollout__enabled_percent": release.enabled_percent if release is not None else None,
    }


def _policy_row(pk: Any) -> dict[str, Any] | None:
    """The tool's kill switch, plugin install and rollout, one query."""
    return _policy_query(pk).first()


def granted_scopes(tenant_id: int) -> list[str]:
    """The scopes an owner consented to for the tenant's live plugin installs (one query, read at every run's start:
    unordered, so no join to the tenants for their default order)."""
    found = _granted_query(tenant_id)
    granted: list[str] = []
    for scopes in found:
        granted.extend(str(s) for s in scopes or [])
    return granted


def _granted_query(tenant_id: int) -> QuerySet[PluginInstall, Any]:
    return (PluginInstall.objects.filter(tenant_id=tenant_id, status__in=ACTIVE_INSTALL_STATUSES)
            .order_by().values_list("granted_scopes", flat=True))
