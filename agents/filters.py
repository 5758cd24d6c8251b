"""``/runs`` and ``/sessions`` query parameters (core/filters.py)."""

from __future__ import annotations

from typing import Any

import django_filters

from agents.models import Run, Session
from core.filters import TrueFalse


class RunFilter(django_filters.FilterSet):
    needs_attention = TrueFalse(help_text="true: only runs an operator must check (needs_attention); false: only the others.")
    playground = TrueFalse(help_text="true: only runs started from the console's playground; false: only the others.")
    parent_run = django_filters.UUIDFilter(field_name="facts__parent_run", method="_parent",
                                           help_text="Only the child runs this run started (agent-kind tools, supervisors).")

    class Meta:
        model = Run
        fields = ["needs_attention", "playground", "parent_run"]

    def _parent(self, queryset: Any, name: str, value: Any) -> Any:
        return queryset.filter(facts__parent_run=str(value))


class SessionFilter(django_filters.FilterSet):
    agent = django_filters.CharFilter(field_name="agent__slug", help_text="Only this agent's sessions (its slug).")
    erased = TrueFalse(field_name="erased_at", lookup_expr="isnull", exclude=True,
                       help_text="true: only erased sessions; false: only the others.")

    class Meta:
        model = Session
        fields = ["agent", "erased"]
