"""The admin's side of the one scoping gate: non-superusers see and pick only their tenants' rows."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from tenants.scoping import actor_for_user

#: Which tenant action a kind of admin permission needs.
_NEEDS = {"view": "view", "change": "operate", "add": "operate", "delete": "operate"}


class TenantScopedAdmin(admin.ModelAdmin):
    """Rows are filtered to the user's tenants; what they may do follows their role there.

    ``manage_action`` is the tenant action needed to add/change/delete (``own`` for members and keys).
    ``read_only`` makes the model read-only for everyone (audit, events).
    """

    manage_action = "operate"
    view_action = "view"
    read_only = False

    def _actor(self, request: HttpRequest) -> Any:
        return actor_for_user(request.user)

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).for_actor(self._actor(request), self.view_action)

    def has_module_permission(self, request: HttpRequest) -> bool:
        actor = self._actor(request)
        return actor.is_superuser or bool(actor.roles)

    def _allowed(self, request: HttpRequest, kind: str, obj: Any = None) -> bool:
        if self.read_only and kind != "view":
            return False
        actor = self._actor(request)
        needed = self.manage_action if kind != "view" else self.view_action
        if obj is not None:
            tenant_id = getattr(obj, "tenant_id", None)
            return (tenant_id is None and actor.is_superuser) or (tenant_id is not None and actor.can(needed, tenant_id))
        ids = actor.tenant_ids(needed)
        return ids is None or bool(ids)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, "view", obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, "change", obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, "add")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._allowed(request, "delete", obj)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        """Foreign-key choices come from the tenants where the user may manage."""
        related = db_field.related_model
        manager = getattr(related, "objects", None)
        if manager is not None and hasattr(manager.all(), "for_actor"):
            kwargs["queryset"] = manager.all().for_actor(self._actor(request), self.manage_action)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)
