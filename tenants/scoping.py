"""THE one place where tenancy is decided.

Every tenant-owned queryset is narrowed with ``for_actor(actor, action)``; the API's base
viewset, the admin mixin, the websocket consumers and the approval pages all go through it,
so a foreign tenant's object is simply not found (a 404) everywhere alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import models

from core.errors import Forbidden, NotFound

if TYPE_CHECKING:
    from tenants.models import ApiKey, Tenant

#: What each role may do. ``view`` reads; ``review`` sees approval requests; ``operate`` starts runs and
#: manages configuration; ``approve`` decides approval requests; ``own`` manages members, keys and consents.
ROLE_ACTIONS: Mapping[str, frozenset[str]] = {
    "owner": frozenset({"view", "review", "operate", "approve", "own"}),
    "operator": frozenset({"view", "review", "operate"}),
    "approver": frozenset({"view", "review", "approve"}),
    "viewer": frozenset({"view"}),
}
ACTIONS = frozenset({"view", "review", "operate", "approve", "own"})


@dataclass(frozen=True)
class Actor:
    """Who is asking: a user (session) or an API key, with a role per tenant."""

    user: Any = None
    api_key: ApiKey | None = None
    roles: Mapping[int, str] = field(default_factory=dict)
    is_superuser: bool = False

    def can(self, action: str, tenant_id: int) -> bool:
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        if self.is_superuser:
            return True
        role = self.roles.get(tenant_id)
        return role is not None and action in ROLE_ACTIONS[role]

    def tenant_ids(self, action: str = "view") -> list[int] | None:
        """The tenants where the actor may do ``action``; ``None`` means all (a superuser)."""
        if self.is_superuser:
            return None
        return sorted(tid for tid in self.roles if self.can(action, tid))

    def require(self, action: str, tenant_id: int) -> None:
        """Raise unless the actor may do ``action`` in the tenant: a tenant it has no role in is not found
        (a foreign tenant's object is a 404 everywhere), a role without the action is forbidden."""
        if self.can(action, tenant_id):
            return
        if not self.is_superuser and tenant_id not in self.roles:
            raise NotFound("No such object.")
        raise Forbidden(self.refusal(action, tenant_id))

    def refusal(self, action: str, tenant_id: int) -> str:
        """Why the actor may not do ``action`` here, and which roles may."""
        roles = " or ".join(role for role, actions in ROLE_ACTIONS.items() if action in actions)
        role = self.roles.get(tenant_id)
        mine = f"Your role in this tenant is {role}" if role else "You have no role in this tenant"
        return f"{mine}; to {action} here you need the role {roles}."

    @property
    def user_id(self) -> int | None:
        return getattr(self.user, "pk", None)


ANONYMOUS = Actor()
#: The platform itself (seeds, start-up, management commands run by the deployment): may do anything; the audit
#: records no person for it.
SYSTEM = Actor(is_superuser=True)


def acting(actor: Actor | None) -> Actor:
    """The one way services take who is acting: an :class:`Actor` (``None`` is the platform, :data:`SYSTEM`).

    Callers holding a user turn it into an actor with :func:`actor_for_user`, so roles are read in one place.
    """
    if actor is None:
        return SYSTEM
    if not isinstance(actor, Actor):
        raise TypeError(f"services take an Actor (tenants.scoping.actor_for_user(user)), not {type(actor).__name__}")
    return actor


def actor_for_user(user: Any) -> Actor:
    """The actor for a logged-in user, memoised on the user object for the request."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return ANONYMOUS
    cached = getattr(user, "_agentops_actor", None)
    if cached is not None:
        return cached
    from tenants.models import Membership

    roles = dict(
        Membership.objects.filter(user=user, tenant__is_active=True).values_list("tenant_id", "role")
    )
    actor = Actor(user=user, roles=roles, is_superuser=user.is_superuser)
    user._agentops_actor = actor
    return actor


def lower_role(a: str, b: str) -> str:
    """The greatest role whose rights lie within both ``a`` and ``b`` (operator and approver meet at viewer)."""
    if a == b:
        return a
    both = ROLE_ACTIONS[a] & ROLE_ACTIONS[b]
    return max((r for r, actions in ROLE_ACTIONS.items() if actions <= both), key=lambda r: len(ROLE_ACTIONS[r]))


def owner_role(key: ApiKey) -> str | None:
    """The key owner's current role in the key's tenant; ``None`` if they left it or were deactivated.

    ``tenants.auth.find_api_key`` loads it with the key (``owner_role`` annotation, same query); a key
    loaded otherwise costs one query here.
    """
    if not key.created_by.is_active:
        return None
    if hasattr(key, "owner_role"):
        return key.owner_role
    from tenants.models import Membership

    roles = Membership.objects.filter(tenant_id=key.tenant_id, user_id=key.created_by_id).order_by().values_list("role", flat=True)
    return next(iter(roles[:1]), None)


def effective_key_role(key: ApiKey) -> str | None:
    """A key acts with the lower of its own role and its owner's current role; ``None``: no access at all."""
    role = owner_role(key)
    return None if role is None else lower_role(key.role, role)


def actor_for_api_key(key: ApiKey) -> Actor:
    """An API key acts in its own tenant only, with its effective role (never more than its owner may do today)."""
    role = effective_key_role(key)
    return Actor(user=key.created_by, api_key=key, roles={} if role is None else {key.tenant_id: role})


def actor_for_request(request: Any) -> Actor:
    from tenants.models import ApiKey

    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiKey):
        return actor_for_api_key(auth)
    return actor_for_user(getattr(request, "user", None))


class TenantScopedQuerySet(models.QuerySet):
    #: The field holding the tenant's id on this model.
    tenant_field = "tenant_id"

    def for_actor(self, actor: Actor, action: str = "view") -> TenantScopedQuerySet:
        ids = actor.tenant_ids(action)
        if ids is None:
            return self
        return self.for_tenant_ids(ids)

    def for_tenant_ids(self, ids: list[int]) -> TenantScopedQuerySet:
        """Rows of these tenants (``for_actor`` once the actor's tenants are known)."""
        return self.filter(**{f"{self.tenant_field}__in": ids})

    def for_tenant(self, tenant: Tenant | int) -> TenantScopedQuerySet:
        tenant_id = tenant if isinstance(tenant, int) else tenant.pk
        return self.filter(**{self.tenant_field: tenant_id})


class TenantQuerySet(TenantScopedQuerySet):
    tenant_field = "pk"


class TenantOwned(models.Model):
    """Base for every tenant-owned row."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        abstract = True


def single_tenant(actor: Actor, action: str, requested: str | None) -> Tenant:
    """The tenant an actor acts in when creating something.

    An API key acts in its own tenant. A user in one tenant acts there; a user in several
    must name one (``X-Tenant`` header or a ``tenant`` field).
    """
    from tenants.models import Tenant

    if actor.api_key is not None:
        if not actor.can(action, actor.api_key.tenant_id):
            raise LookupError(f"This API key may not {action} here: its role, or its owner's current role in the tenant, "
                              "does not allow it.")
        return Tenant.objects.get(pk=actor.api_key.tenant_id)  # read fresh: its settings hold its guardrails
    allowed = Tenant.objects.for_actor(actor, action).filter(is_active=True)
    if requested:
        tenant = allowed.filter(slug=requested).first()
        if tenant is None:
            raise LookupError(f"You cannot {action} in a tenant named {requested!r}.")
        return tenant
    choices = list(allowed[:2])
    if len(choices) == 1:
        return choices[0]
    if not choices:
        raise LookupError(f"You have no tenant where you may {action}.")
    raise LookupError("You belong to several tenants; say which one with the X-Tenant header (its slug).")
