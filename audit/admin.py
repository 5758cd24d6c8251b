from __future__ import annotations

from django.contrib import admin

from audit.models import ConfigChange, ToolCallAudit
from tenants.admin_mixins import TenantScopedAdmin


@admin.register(ToolCallAudit)
class ToolCallAuditAdmin(TenantScopedAdmin):
    read_only = True
    list_display = ["created_at", "tool_name", "status", "run", "step", "latency_ms", "tenant"]
    list_filter = ["status", "tool_name", "tenant"]
    list_select_related = ["tenant"]
    search_fields = ["run__id", "tool_name", "call_id"]
    date_hierarchy = "created_at"
    # Every id the model gave the call (a crash-resumed write has several); shown read-only like every field here.
    readonly_fields = ["attempt_call_ids"]


@admin.register(ConfigChange)
class ConfigChangeAdmin(TenantScopedAdmin):
    read_only = True
    list_display = ["created_at", "action", "target_repr", "actor", "tenant"]
    list_filter = ["action", "tenant"]
    list_select_related = ["actor", "tenant"]
