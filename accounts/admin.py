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
    # saved by TenantAdmin.save_formset through the membership services


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    list_display = ["slug", "name", "is_active", "created_at"]
    search_fields = ["slug", "name"]
    manage_action = "own"
    inlines = [MembershipInline]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # ``settings`` holds what the platform grants a tenant (deployment secrets it may name, default scopes, its
        # model rate limit, guardrail modes) and max_running (its bound on running work): a tenant's owner may rename
        # the tenant, never widen its own grants.
        if self._actor(request).is_superuser:
            return super().get_readonly_fields(request, obj)
        return [*super().get_readonly_fields(request, obj), "slug", "is_active", "settings", "max_running"]

    def _allowed(self, request: HttpRequest, kind: str, obj: Any = None) -> bool:
        actor = self._actor(request)
        if kind == "add":
            return actor.is_superuser
        if kind == "delete":  # a tenant holds its runs and audit trail: deactivate it (is_active) instead
            return False
        if obj is not None:
            return actor.can("view" if kind == "view" else "own", obj.pk)
        return super()._allowed(request, kind, obj)

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        actor = self._actor(request)
        fields = {name: form.cleaned_data[name] for name in services.TENANT_FIELDS if name in form.cleaned_data}
        if change:
            changed = {name: value for name, value in fields.items() if name in form.changed_data}
            services.update_tenant(tenant=Tenant.objects.get(pk=obj.pk), actor=actor, **changed)
            return
        created = services.create_tenant(actor=actor, **fields)
        obj.pk = created.pk
        obj._state.adding = False

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        """Members added, changed or removed on the tenant's page go through the membership services."""
        actor = self._actor(request)
        formset.save(commit=False)  # fills new_objects, changed_objects and deleted_objects; writes nothing
        for membership in formset.deleted_objects:
            services.remove_membership(membership=membership, actor=actor)
        for membership, changed in formset.changed_objects:
            if "user" in changed:  # the row now names someone else: the old member leaves, the new one joins
                services.remove_membership(membership=Membership.objects.get(pk=membership.pk), actor=actor)
            services.set_membership(tenant=form.instance, user=membership.user, role=membership.role, actor=actor)
        for membership in formset.new_objects:
            services.set_membership(tenant=form.instance, user=membership.user, role=membership.role, actor=actor)


@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    list_select_related = ["user", "tenant"]
    search_fields = ["user__username", "tenant__slug"]
    manage_action = "own"

    def save_model(self, request: HttpRequest, obj: Membership, form: Any, change: bool) -> None:
        membership = services.set_membership(tenant=obj.tenant, user=obj.user, role=obj.role, actor=self._actor(request))
        obj.pk = membership.pk

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        services.remove_membership(membership=obj, actor=self._actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for membership in queryset.select_related("tenant", "user"):
            services.remove_membership(membership=membership, actor=self._actor(request))


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

    def _allowed(self, request: HttpRequest, kind: str, obj: Any = None) -> bool:
        # a key is revoked, never deleted: the audit rows and runs made with it keep saying which key it was
        return kind != "delete" and super()._allowed(request, kind, obj)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        actor = self._actor(request)
        if change:
            services.rename_api_key(key=ApiKey.objects.get(pk=obj.pk), name=obj.name, actor=actor)
            return
        key, raw = services.create_api_key(tenant=obj.tenant, name=obj.name, owner=obj.created_by, role=obj.role, actor=actor)
        obj.pk = key.pk
        self.message_user(request, f"The new key is {raw} — copy it now; it will not be shown again.", messages.WARNING)

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        for key in queryset:
            services.revoke_api_key(key=key, actor=self._actor(request))
        self.message_user(request, f"Revoked {queryset.count()} key(s).")
