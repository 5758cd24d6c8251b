"""The API's base viewset: the tenant is resolved and checked here, once, for every endpoint."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from rest_framework import exceptions, viewsets

from tenants.models import Tenant
from tenants.scoping import Actor, actor_for_request, single_tenant


class TenantScopedViewSet(viewsets.GenericViewSet):
    """Querysets are narrowed to the actor's tenants for the action at hand; foreign objects are 404s.

    ``scope_actions`` maps a viewset action to the tenant action it needs (view, operate, approve, own).
    """

    scope_actions: dict[str, str] = {
        "list": "view", "retrieve": "view", "create": "operate", "update": "operate",
        "partial_update": "operate", "destroy": "operate",
    }

    @cached_property
    def actor(self) -> Actor:
        return actor_for_request(self.request)

    def tenant_action(self) -> str:
        return self.scope_actions.get(self.action or "", "view")

    def get_queryset(self) -> Any:
        queryset = super().get_queryset()
        # Anything the actor can see is found; what they may do with it is checked per object (403).
        return queryset.for_actor(self.actor, "view")

    def check_object_permissions(self, request: Any, obj: Any) -> None:
        super().check_object_permissions(request, obj)
        tenant_id = getattr(obj, "tenant_id", None)
        if tenant_id is not None:
            self.actor.require(self.tenant_action(), tenant_id)  # a Forbidden (403) naming the role it needs

    def acting_tenant(self, action: str = "operate") -> Tenant:
        try:
            return single_tenant(self.actor, action, self.request.headers.get("X-Tenant"))
        except LookupError as exc:
            raise exceptions.PermissionDenied(str(exc)) from None
