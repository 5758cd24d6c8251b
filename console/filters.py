"""The run list's filters (``/console/runs/?agent=&status=&day=...``) as a django-filter FilterSet.

The page is lenient where the API is strict: a bad value is ignored with a message saying why, and the other
filters still apply (``console.queries.RunFilters`` holds the page's state for the template and the live list).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import django_filters

from agents.models import Run, RunStatus
from core.filters import DayField, IdNumber, OneOf
from runtime.types import TerminalReason

TERMINAL_REASONS = [r.value for r in TerminalReason]


def _start_of(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)


class DayFilter(django_filters.CharFilter):
    """Runs created on this day (UTC)."""

    field_class = DayField

    def filter(self, qs: Any, value: Any) -> Any:
        if not value:
            return qs
        start = _start_of(value)
        return qs.filter(created_at__gte=start, created_at__lt=start + dt.timedelta(days=1))


class SinceDayFilter(django_filters.CharFilter):
    """Runs created on or after this day (UTC)."""

    field_class = DayField

    def filter(self, qs: Any, value: Any) -> Any:
        return qs.filter(created_at__gte=_start_of(value)) if value else qs


class RunListFilter(django_filters.FilterSet):
    agent = IdNumber(field_name="agent_id")
    version = IdNumber(field_name="version_id")
    user = IdNumber(field_name="created_by_id")
    status = OneOf(values=RunStatus.values)
    reason = OneOf(field_name="terminal_reason", values=TERMINAL_REASONS)
    attention = OneOf(values=["1", "0"], expected="1 (needs attention) or 0", method="by_attention")
    day = DayFilter()
    since = SinceDayFilter()

    class Meta:
        model = Run
        fields = ["agent", "version", "user", "status", "reason", "attention", "day", "since"]

    def by_attention(self, queryset: Any, name: str, value: str) -> Any:
        return queryset.filter(needs_attention=value == "1")
