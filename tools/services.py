"""Tool configuration changes: ``actor`` is an Actor (``None``: the platform), checked once, recorded in the audit row."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from audit.services import record_change
from core.errors import Refused
from runtime import approval_policy
from tenants.scoping import Actor, acting
from tools import handlers, rate_limits
from tools.models import Tool, ToolKind


@transaction.atomic
def install_python_tool(*, tenant: Any, key: str, actor: Actor | None, **overrides: Any) -> Tool:
    """Create or refresh the tenant's row for a registered Python tool."""
    acting(actor).require("operate", tenant.pk)
    from tools.pyfunc import registry

    spec = registry.get(key)
    defaults = {
        "description": spec.description,
        "kind": ToolKind.PYTHON,
        "parameters": spec.schema,
        "config": {"function": key},
        "category": spec.category,
        "idempotent": spec.idempotent,
        **overrides,
    }
    tool, created = Tool.objects.update_or_create(tenant=tenant, name=spec.name, defaults=defaults)
    record_change(tenant=tenant, actor=actor, action="tool.created" if created else "tool.updated", target=tool,
                  details={"function": key})
    return tool


@transaction.atomic
def set_tool_enabled(*, tool: Tool, enabled: bool, actor: Actor | None) -> Tool:
    acting(actor).require("operate", tool.tenant_id)
    if tool.enabled != enabled:
        Tool.objects.filter(pk=tool.pk).update(enabled=enabled)
        tool.enabled = enabled
        record_change(tenant=tool.tenant, actor=actor, action="tool.enabled" if enabled else "tool.disabled", target=tool)
    return tool


# -- tools managed through the API (operators) ------------------------------------------------


class ToolRefused(Refused):
    """A tool change that cannot be made; the message says why and what to do instead (400 naming ``field``, else 409)."""


#: The fields an operator sets on a tool.
TOOL_FIELDS = (
    "name", "description", "kind", "parameters", "output_schema", "config", "category", "idempotent", "required_scopes",
    "requires_approval", "enabled", "timeout_seconds", "result_fields", "summary_template", "result_size_cap", "sensitive_fields",
    "approval_policy", "rate_limit_per_minute",
)
#: What may change on a plugin's tool: the kill switch, and its rate limit within the plugin's (a floor).
PLUGIN_TOOL_FIELDS = frozenset({"enabled", "rate_limit_per_minute"})


def _versions_listing(tool: Tool, *, current_only: bool) -> list[str]:
    lookup = handlers.agents.agents_using
    return lookup(tool, current_only) if lookup else []


def _name_taken(tenant: Any, name: str, exclude: int | None = None) -> None:
    taken = Tool.objects.for_tenant(tenant).filter(name=name).exclude(pk=exclude)
    if taken.exists():
        raise ToolRefused(f"The tenant already has a tool named {name!r}; choose another name or change that tool.", field="name")


@transaction.atomic
def create_tool(*, tenant: Any, actor: Actor | None, **fields: Any) -> Tool:
    """A tenant's own tool."""
    from django.db import IntegrityError

    acting(actor).require("operate", tenant.pk)
    _check_policy(fields)
    _check_rate_limit(fields)
    _name_taken(tenant, fields["name"])
    try:
        with transaction.atomic():
            tool = Tool.objects.create(tenant=tenant, **{k: v for k, v in fields.items() if k in TOOL_FIELDS})
    except IntegrityError:  # created by someone else a moment ago
        raise ToolRefused(f"The tenant already has a tool named {fields['name']!r}.", field="name") from None
    record_change(tenant=tenant, actor=actor, action="tool.created", target=tool,
                  details=dict(kind=tool.kind, fields=sorted(k for k in fields if k in TOOL_FIELDS)))
    return tool


def _owner_in_person(actor: Actor | None, tenant_id: Any) -> bool:
    """The tenant's owner with a session: an API key is not a person, whoever created it."""
    return isinstance(actor, Actor) and actor.api_key is None and actor.user is not None and actor.roles.get(tenant_id) == "owner"


def _approval_loosened(tool: Tool, fields: dict[str, Any], changed: list[str]) -> list[str]:
    """How the change would make the tool's own approval policy looser (a human asked less often, by fewer people)."""
    if not {"requires_approval", "approval_policy"} & set(changed):
        return []
    old = approval_policy.normalise(tool.approval_policy, requires_approval=tool.requires_approval)
    new = approval_policy.normalise(fields.get("approval_policy", tool.approval_policy),
                                    requires_approval=fields.get("requires_approval", tool.requires_approval))
    return approval_policy.looser_fields(old, new, path="approval_policy")


def _check_policy(fields: dict[str, Any]) -> None:
    problems = approval_policy.policy_errors(fields.get("approval_policy") or {}, path="approval_policy")
    if problems:
        raise ToolRefused("; ".join(problems), field="approval_policy")


def approval_loosening_refusal(*, tool: Tool, actor: Actor | None, fields: dict[str, Any], changed: list[str]) -> list[tuple[str, str]]:
    """``[(field, message)]`` when ``actor`` may not make this change to the tool's approval (empty: it may)."""
    loosened = _approval_loosened(tool, fields, [c for c in changed if c in TOOL_FIELDS])
    if not loosened or _owner_in_person(actor, tool.tenant_id):
        return []
    field = "approval_policy" if "approval_policy" in changed else "requires_approval"
    return [(field, f"{loosened[0]}; only the tenant's owner, signed in (not with an API key), can loosen a tool's own "
                    "approval policy.")]


def declared_rate_limit(tool: Tool) -> int | None:
    """The rate limit the installed plugin declares for its tool (None: the plugin sets none, or it is the tenant's own)."""
    install = tool.plugin_install
    plugin = getattr(install, "plugin", None) if install is not None else None
    for entry in (plugin.tools if plugin is not None else None) or []:
        if entry.get("name") == tool.name:
            value = (entry.get("overrides") or {}).get(rate_limits.FIELD)
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def rate_limit_refusal(*, tool: Tool, value: Any) -> str:
    """Why ``value`` may not be the tool's rate limit (empty: it may). A plugin's declared limit is a floor for the tenant."""
    problem = rate_limits.value_problem(value)
    if problem or tool.plugin_install_id is None:
        return problem
    return rate_limits.floor_problem(tool_name=tool.name, plugin=tool.plugin_install.plugin_key,
                                     declared=declared_rate_limit(tool), value=value)


def _check_rate_limit(fields: dict[str, Any]) -> None:
    problem = rate_limits.value_problem(fields.get(rate_limits.FIELD))
    if problem:
        raise ToolRefused(problem, field=rate_limits.FIELD)


def check_change(*, current: Tool, actor: Actor | None, fields: dict[str, Any]) -> list[str]:
    """The fields a change would alter, after every check saving it makes (raises :class:`ToolRefused`). Writes nothing:
    ``update_tool`` and the impact preview (agents/shadow.py) both call it, so a preview is refused exactly as saving."""
    changed = sorted(k for k, v in fields.items() if k in TOOL_FIELDS and getattr(current, k) != v)
    if current.plugin_install_id is not None and set(changed) - PLUGIN_TOOL_FIELDS:
        raise ToolRefused(f"The tool {current.name} comes from the plugin {current.plugin_install.plugin_key!r}: it changes with "
                          "the plugin. You can only switch it off or on here (enabled), or lower its rate limit "
                          "(rate_limit_per_minute).", field=sorted(set(changed) - PLUGIN_TOOL_FIELDS)[0])
    if rate_limits.FIELD in changed:
        refusal = rate_limit_refusal(tool=current, value=fields[rate_limits.FIELD])
        if refusal:
            raise ToolRefused(refusal, field=rate_limits.FIELD)
    if "name" in changed:
        _name_taken(current.tenant, fields["name"], exclude=current.pk)
        users = _versions_listing(current, current_only=False)
        if users:
            raise ToolRefused(f"Agent versions list the tool by its name {current.name!r} ({', '.join(users)}); renaming it "
                              "would break them. Create a new tool with the new name instead.", field="name")
    if "approval_policy" in changed:
        _check_policy(fields)
    refusal = approval_loosening_refusal(tool=current, actor=actor, fields=fields, changed=changed)
    if refusal:
        raise ToolRefused(refusal[0][1], field=refusal[0][0])
    return changed


@transaction.atomic
def update_tool(*, tool: Tool, actor: Actor | None, **fields: Any) -> Tool:
    """Change a tool; a plugin's tool can only be switched on or off and its rate limit lowered, a name in use by agents
    cannot change."""
    acting(actor).require("operate", tool.tenant_id)
    current = Tool.objects.select_for_update(of=("self",)).select_related("tenant", "plugin_install__plugin").get(pk=tool.pk)
    changed = check_change(current=current, actor=actor, fields=fields)
    loosened = _approval_loosened(current, fields, changed)
    before = {"requires_approval": current.requires_approval, "approval_policy": current.approval_policy}
    for key in changed:
        setattr(current, key, fields[key])
    if changed:
        current.save()
        if loosened:
            record_change(tenant=current.tenant, actor=actor, action="tool.approval_loosened", target=current,
                          details=dict(loosened=loosened, before=before,
                                                 after={"requires_approval": current.requires_approval,
                                                        "approval_policy": current.approval_policy}))
        action = "tool.updated"
        if changed == ["enabled"]:
            action = "tool.enabled" if current.enabled else "tool.disabled"
        record_change(tenant=current.tenant, actor=actor, action=action, target=current,
                      details=dict(changed=changed))
    return current


@transaction.atomic
def delete_tool(*, tool: Tool, actor: Actor | None) -> None:
    """Delete a tenant's own tool that no agent's current version lists."""
    acting(actor).require("operate", tool.tenant_id)
    current = Tool.objects.select_for_update(of=("self",)).select_related("tenant", "plugin_install").get(pk=tool.pk)
    if current.plugin_install_id is not None:
        raise ToolRefused(f"The tool {current.name} comes from the plugin {current.plugin_install.plugin_key!r}; uninstall "
                          "the plugin, or switch the tool off (enabled=false).")
    users = _versions_listing(current, current_only=True)
    if users:
        raise ToolRefused(f"The current version of {', '.join(users)} uses {current.name}; make a version without it first, "
                          "or switch the tool off (enabled=false).")
    record_change(tenant=current.tenant, actor=actor, action="tool.deleted", target=current,
                  details=dict(name=current.name, kind=current.kind))
    current.delete()
