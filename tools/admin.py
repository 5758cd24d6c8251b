from __future__ import annotations

from django.contrib import admin

from tenants.admin_mixins import TenantScopedAdmin
from tools.models import Tool


@admin.register(Tool)
class ToolAdmin(TenantScopedAdmin):
    list_display = ["name", "tenant", "kind", "category", "requires_approval", "enabled", "updated_at"]
    list_filter = ["tenant", "kind", "category", "enabled", "requires_approval"]
    list_editable = ["enabled"]
    list_select_related = ["tenant"]
    search_fields = ["name", "description"]
