"""When a tool call needs a human approval: a tool's declared policy, its floor, a version's override, the rule for a call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audit.masking import mask_value
from audit.models import ConfigChange
from runtime.approval_policy import (
    DEFAULT_APPROVER_ROLES,
    DEFAULT_EXPIRY_SECONDS,
    describe,
    holds,
    looser_fields,
    normalise,
    stricter,
    strip_flag,
)
from runtime.approval_policy import policy_errors as policy_errors
from tools import kinds
from tools.models import Tool

#: The config-change action that records a tenant owner loosening a tool's approval floor for one agent version.
FLOOR_OVERRIDE_ACTION = "agent_version.approval_floor_overridden"


@dataclass(frozen=True)
class ApprovalRule:
    needed: bool
    reason: str = ""
    expires_in: int = DEFAULT_EXPIRY_SECONDS
    approver_roles: tuple[str, ...] = DEFAULT_APPROVER_ROLES
    four_eyes: bool = False


def declared_policy(tool: Tool) -> dict[str, Any] | None:
    """What the plugin that provides ``tool`` declares for it (normalised); None for a tenant's own tool."""
    if tool.plugin_install_id is None:
        return None
    plugin = tool.plugin_install.plugin if tool.plugin_install is not None else None
    entry = next((e for e in (plugin.tools if plugin is not None else []) if isinstance(e, dict) and e.get("name") == tool.name), None)
    if entry is None:
        return normalise({"mode": "always"})  # a plugin tool whose declaration cannot be found: ask a person
    declared = entry.get("approval_policy") if isinstance(entry.get("approval_policy"), dict) else None
    return normalise(declared, requires_approval=bool(entry.get("requires_approval")))


def floor_for(tool: Tool, declared: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tool's own approval policy, the floor no agent version may loosen: its row, and its plugin's declaration."""
    own = normalise(tool.approval_policy, requires_approval=tool.requires_approval)
    declared = declared if declared is not None else declared_policy(tool)
    return stricter(declared, own) if declared is not None else own


def version_policy(tool: Tool, entry: dict[str, Any]) -> dict[str, Any]:
    """An agent version's entry for the tool, over the tool's row (normalised)."""
    return normalise({**(tool.approval_policy or {}), **strip_flag(entry)}, requires_approval=tool.requires_approval)


def loosening(tool: Tool, entry: dict[str, Any], *, path: str) -> list[str]:
    """Each way a version's entry is looser than the tool's floor, as ``path.field: ...``."""
    return looser_fields(floor_for(tool), version_policy(tool, entry), path=path)


def recorded_overrides(*, tenant_id: Any, version_id: Any) -> dict[str, list[Any]]:
    """The entries (by tool name) that the tenant's owner explicitly loosened for this version (config-change rows)."""
    found: dict[str, list[Any]] = {}
    if version_id is None:
        return found
    rows = ConfigChange.objects.filter(tenant_id=tenant_id, action=FLOOR_OVERRIDE_ACTION, target_type="AgentVersion",
                                       target_id=str(version_id)).values_list("details", flat=True)
    for details in rows:
        if isinstance(details, dict) and isinstance(details.get("tool"), str):
            found.setdefault(details["tool"], []).append(details.get("after"))
    return found


def rule_for(tool: Tool, arguments: dict[str, Any], override: dict[str, Any] | None = None, *,
             declared: dict[str, Any] | None = None, owner_override: bool = False) -> ApprovalRule:
    """The rule for one call: the stricter of the tool's floor and the version's entry ``override``,
    or the entry alone when the tenant's owner loosened the floor for it (``owner_override``)."""
    floor = floor_for(tool, declared)
    if override:
        mine = version_policy(tool, override)
        policy = mine if owner_override else stricter(floor, mine)
    else:
        policy = floor
    if policy["mode"] == "never":
        return ApprovalRule(False)
    if policy["mode"] == "condition":
        met = [c for c in policy["conditions"] if holds(c, arguments)]
        if not met:
            return ApprovalRule(False)
        reason = "; ".join(describe(c) for c in met)
    else:
        reason = "this tool always needs approval"
    return ApprovalRule(
        True,
        reason,
        expires_in=policy["expires_in_seconds"],
        approver_roles=tuple(policy["approver_roles"]),
        four_eyes=policy["four_eyes"],
    )


def render_preview(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
    """What will happen, for the approver: for HTTP tools the method and URL filled in, headers masked."""
    sensitive = tool.sensitive_fields or ()
    preview: dict[str, Any] = {
        "tool": tool.name,
        "description": tool.description.split("\n")[0][:300],
        "arguments": mask_value(arguments, sensitive),
    }
    kind = kinds.kind_for(tool.kind)
    if kind is not None and kind.request_preview is not None:
        try:
            preview["request"] = kind.request_preview(tool, arguments, sensitive)
        except Exception as exc:  # a preview must never block the request; say why it is missing
            preview["request_error"] = str(exc)
    return preview
