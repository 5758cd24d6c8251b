"""The marketplace's refusals (one DomainError family: the API maps them once) and how its services take the actor."""

from __future__ import annotations

from typing import Any

from core.errors import Forbidden, Invalid, NotFound
from tenants.scoping import Actor, acting


class MarketplaceError(Invalid):
    """A refused change (400); the message says what was wrong and what to do. ``field`` names the input at fault."""


class NotAllowed(MarketplaceError, Forbidden):
    """The actor's role in the tenant does not allow it (403)."""

    code = "forbidden"
    status = 403


class PluginNotInstalled(MarketplaceError):
    pass


class InvalidConfig(MarketplaceError):
    """A plugin configuration with problems, each listed under ``config``."""

    def __init__(self, message: str, *, errors: list[str]) -> None:
        super().__init__(message, field="config")
        self.errors = errors

    def details(self) -> list[str]:
        return self.errors


class InvalidWeights(MarketplaceError):
    """Release weights with problems, each listed under ``weights``."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__(" ".join(errors), field="weights")
        self.errors = errors

    def details(self) -> list[str]:
        return self.errors


def acting_with_user(actor: Actor | None) -> tuple[Actor, Any]:
    """(the Actor, for role checks and the audit row; the user behind it, for the rows' ``*_by`` columns)."""
    who = acting(actor)
    return who, who.user


def require(actor: Actor, action: str, tenant_id: int, doing: str) -> None:
    """As ``Actor.require``: a tenant the actor has no role in is not found (a foreign object is a 404 everywhere); a
    role without the action is refused, saying which roles may."""
    if not actor.can(action, tenant_id):
        if not actor.is_superuser and tenant_id not in actor.roles:
            raise NotFound("No such object.")
        role = {"own": "an owner", "operate": "an operator or owner", "approve": "an approver or owner"}.get(action, action)
        raise NotAllowed(f"Only {role} of this tenant may {doing}.")
