from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from agents.models import Agent, AgentVersion, Run, RunEvent, Session
from tenants.admin_mixins import TenantScopedAdmin


class ReadOnlyAdmin(TenantScopedAdmin):
    read_only = True


@admin.register(Agent)
class AgentAdmin(TenantScopedAdmin):
    list_display = ["slug", "name", "tenant", "current_version", "updated_at"]
    list_filter = ["tenant"]
    list_select_related = ["tenant", "current_version"]
    search_fields = ["slug", "name"]


@admin.register(AgentVersion)
class AgentVersionAdmin(TenantScopedAdmin):
    list_display = ["agent", "number", "model", "tenant", "created_at"]
    list_filter = ["tenant", "model"]
    list_select_related = ["agent", "tenant"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and obj.is_locked:
            # A version a run used is history: make a new version instead.
            return [f.name for f in self.model._meta.fields]
        return ["created_at"]


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    list_display = ["id", "agent", "tenant", "turns", "model_calls", "created_at"]
    list_filter = ["tenant"]
    list_select_related = ["agent", "tenant"]


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["id", "agent", "status", "terminal_reason", "step", "tenant", "created_at", "finished_at"]
    list_filter = ["status", "terminal_reason", "tenant"]
    list_select_related = ["agent", "tenant"]
    search_fields = ["id", "input"]
    date_hierarchy = "created_at"


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ["run", "seq", "type", "step", "at"]
    list_filter = ["type", "tenant"]
    search_fields = ["run__id"]
