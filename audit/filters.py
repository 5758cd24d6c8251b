"""``/audit/tool-calls`` and ``/audit/changes`` query parameters (core/filters.py)."""

from __future__ import annotations

from typing import Any

import django_filters

from audit.models import ConfigChange, ToolCallAudit, ToolCallStatus
from core.filters import IdFilter, OneOf, Since, Until


class _Window(django_filters.FilterSet):
    since = Since(field_name="created_at", help_text="From this ISO date-time or date on (inclusive).")
    until = Until(field_name="created_at", help_text="Up to this ISO date-time, or to the end of this date.")


class ToolCallFilter(_Window):
    run = IdFilter(field_name="run_id", what="run", help_text="Only this run's calls (its id).")
    session = IdFilter(field_name="session_id", what="session", help_text="Only this session's calls (its id).")
    tool = django_filters.CharFilter(field_name="tool_name", help_text="Only calls of this tool (its name).")
    status = OneOf(values=ToolCallStatus.values, help_text="Only calls that ended so.")
    agent = django_filters.CharFilter(field_name="agent__slug", help_text="Only calls made by this agent (its slug).")

    class Meta:
        model = ToolCallAudit
        fields = ["run", "session", "tool", "status", "agent", "since", "until"]


class ConfigChangeFilter(_Window):
    action = django_filters.CharFilter(method="by_action", help_text=(
        "Only this action, e.g. tool.updated; ending in '.' it matches a family (tool.)."))
    target_type = django_filters.CharFilter(help_text="Only changes to this kind of object, e.g. Tool.")
    target_id = django_filters.CharFilter(help_text="Only changes to the object with this id.")
    actor = django_filters.CharFilter(field_name="actor__username", help_text="Only changes made by this user (username).")

    class Meta:
        model = ConfigChange
        fields = ["action", "target_type", "target_id", "actor", "since", "until"]

    def by_action(self, queryset: Any, name: str, value: str) -> Any:
        return queryset.filter(action__startswith=value) if value.endswith(".") else queryset.filter(action=value)
