"""Writing audit rows. Called by services inside their own transaction, never by signals."""

from __future__ import annotations

from typing import Any

from audit.chain import append_change
from audit.models import ConfigChange
from tenants.scoping import Actor


def record_change(*, tenant: Any, actor: Any, action: str, target: Any = None, details: dict[str, Any] | None = None) -> ConfigChange:
    """One config-change row. ``actor``: the :class:`Actor` (its person, and the API key it came through, are
    recorded; an actor with neither is the platform), or a user; ``None`` is the platform."""
    details = dict(details or {})
    if isinstance(actor, Actor):
        if actor.api_key is not None:
            details.setdefault("api_key", actor.api_key.prefix)
        if actor.user is None and actor.api_key is None:
            details.setdefault("by", "platform")
        actor = actor.user  # the person behind the request (an API key's owner)
    elif actor is None:
        details.setdefault("by", "platform")
    user = actor if getattr(actor, "is_authenticated", False) else None
    return append_change(ConfigChange(
        tenant=tenant,
        actor=user,
        action=action,
        target_type=type(target).__name__ if target is not None else "",
        target_id=str(getattr(target, "pk", "") or ""),
        target_repr=str(target)[:300] if target is not None else "",
        details=details,
    ))
