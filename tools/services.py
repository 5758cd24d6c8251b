"""Tool configuration changes, audited with the acting user."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from audit.services import record_change
from tools.models import Tool, ToolKind


@transaction.atomic
def install_python_tool(*, tenant: Any, key: str, actor: Any, **overrides: Any) -> Tool:
    """Create or refresh the tenant's row for a registered Python tool."""
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
def set_tool_enabled(*, tool: Tool, enabled: bool, actor: Any) -> Tool:
    if tool.enabled != enabled:
        Tool.objects.filter(pk=tool.pk).update(enabled=enabled)
        tool.enabled = enabled
        record_change(tenant=tool.tenant, actor=actor, action="tool.enabled" if enabled else "tool.disabled", target=tool)
    return tool
