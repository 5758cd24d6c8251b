from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from tenants.admin_mixins import TenantScopedAdmin
from tools import services
from tools.models import Tool


@admin.register(Tool)
class ToolAdmin(TenantScopedAdmin):
    list_display = ["name", "tenant", "kind", "category", "requires_approval", "enabled", "plugin_install", "updated_at"]
    list_filter = ["tenant", "kind", "category", "enabled", "requires_approval"]
    list_select_related = ["tenant", "plugin_install"]
    search_fields = ["name", "description"]
    actions = ["switch_off", "switch_on"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # The kill switch is flipped with the list actions (audited), and a plugin's link is the install's business.
        return ["enabled", "plugin_install", "created_at", "updated_at"] if obj is not None else ["plugin_install"]

    @admin.action(description="Kill switch: switch the selected tools off", permissions=["change"])
    def switch_off(self, request: HttpRequest, queryset: Any) -> None:
        queryset = queryset.for_actor(self._actor(request), "operate")
        for tool in queryset.select_related("tenant"):
            services.set_tool_enabled(tool=tool, enabled=False, actor=request.user)
        self.message_user(request, f"Switched off {queryset.count()} tool(s); the next call is refused.")

    @admin.action(description="Switch the selected tools back on", permissions=["change"])
    def switch_on(self, request: HttpRequest, queryset: Any) -> None:
        queryset = queryset.for_actor(self._actor(request), "operate")
        for tool in queryset.select_related("tenant"):
            services.set_tool_enabled(tool=tool, enabled=True, actor=request.user)
        self.message_user(request, f"Switched on {queryset.count()} tool(s).")


from tools import approval_admin  # noqa: E402,F401 - the approval queue
