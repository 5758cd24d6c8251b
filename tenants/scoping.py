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

    @property
    def user_id(self) -> int | None:
        return getattr(self.user, "pk", None)


ANONYMOUS = Actor()


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


def actor_for_api_key(key: ApiKey) -> Actor:
    """An API key acts in its own tenant only, with its own role, whoever created it."""
    return Actor(user=key.created_by, api_key=key, roles={key.tenant_id: key.role})


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

    allowed = Tenant.objects.for_actor(actor, action).filter(is_active=True)
    if actor.api_key is not None:
        return Tenant.objects.get(pk=actor.api_key.tenant_id)
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
