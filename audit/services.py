"""Writing audit rows. Called by services inside their own transaction, never by signals."""

from __future__ import annotations

from typing import Any

from audit.chain import append_change
from audit.models import ConfigChange
from tenants.scoping import Actor


def record_change(*, tenant: Any, actor: Any, action: str, target: Any = None, details: dict[str, Any] | None = None) -> ConfigChange:
    if isinstance(actor, Actor):
        actor = actor.user  # the person behind the request (an API key's owner); the services' other callers pass a user
    user = actor if getattr(actor, "is_authenticated", False) else None
    return append_change(ConfigChange(
        tenant=tenant,
        actor=user,
        action=action,
        target_type=type(target).__name__ if target is not None else "",
        target_id=str(getattr(target, "pk", "") or ""),
        target_repr=str(target)[:300] if target is not None else "",
        details=details or {},
    ))
