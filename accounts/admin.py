from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from accounts import services
from tenants.admin_mixins import TenantScopedAdmin, TenantScopedInline
from tenants.models import ApiKey, Membership, Tenant


class MembershipInline(TenantScopedInline, admin.TabularInline):
    model = Membership
    manage_action = "own"  # people offered: members of the tenants the user owns
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    list_display = ["slug", "name", "is_active", "created_at"]
    search_fields = ["slug", "name"]
    manage_action = "own"
    inlines = [MembershipInline]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # ``settings`` holds what the platform grants a tenant (deployment secrets it may name, default scopes, its
        # model rate limit, guardrail modes): a tenant's owner may rename the tenant, never widen its own grants.
        if self._actor(request).is_superuser:
            return super().get_readonly_fields(request, obj)
        return [*super().get_readonly_fields(request, obj), "slug", "is_active", "settings"]

    def _allowed(self, request: HttpRequest, kind: str, obj: Any = None) -> bool:
        actor = self._actor(request)
        if kind == "add":
            return actor.is_superuser
        if obj is not None:
            return actor.can("view" if kind == "view" else "own", obj.pk)
        return super()._allowed(request, kind, obj)


@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    list_select_related = ["user", "tenant"]
    search_fields = ["user__username", "tenant__slug"]
    manage_action = "own"

    def save_model(self, request: HttpRequest, obj: Membership, form: Any, change: bool) -> None:
        services.set_membership(tenant=obj.tenant, user=obj.user, role=obj.role, actor=request.user)


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    list_display = ["name", "prefix", "tenant", "role", "created_by", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenant", "role"]
    list_select_related = ["tenant", "created_by"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["tenant", "name", "role", "created_by", "prefix", "created_at", "last_used_at", "revoked_at"]
    manage_action = "own"
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None:
            return [*self.readonly_fields, "tenant", "role", "created_by"]
        return self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            ApiKey.objects.filter(pk=obj.pk).update(name=obj.name)
            return
        key, raw = services.create_api_key(tenant=obj.tenant, name=obj.name, owner=obj.created_by, role=obj.role, actor=request.user)
        obj.pk = key.pk
        self.message_user(request, f"The new key is {raw} — copy it now; it will not be shown again.", messages.WARNING)

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        for key in queryset:
            services.revoke_api_key(key=key, actor=request.user)
        self.message_user(request, f"Revoked {queryset.count()} key(s).")
