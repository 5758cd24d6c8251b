"""Writing audit rows. Called by services inside their own transaction, never by signals."""

from __future__ import annotations

from typing import Any

from audit.models import ConfigChange


def record_change(*, tenant: Any, actor: Any, action: str, target: Any = None, details: dict[str, Any] | None = None) -> ConfigChange:
    user = actor if getattr(actor, "is_authenticated", False) else None
    return ConfigChange.objects.create(
        tenant=tenant,
        actor=user,
        action=action,
        target_type=type(target).__name__ if target is not None else "",
        target_id=str(getattr(target, "pk", "") or ""),
        target_repr=str(target)[:300] if target is not None else "",
        details=details or {},
    )
