"""``/tools`` query parameters (core/filters.py)."""

from __future__ import annotations

import django_filters

from core.filters import OneOf, TrueFalse
from tools.models import Tool, ToolKind


class ToolFilter(django_filters.FilterSet):
    kind = OneOf(values=ToolKind.values, help_text=f"Only tools of this kind: {', '.join(ToolKind.values)}.")
    enabled = TrueFalse(help_text="Only tools switched on (true) or off (false).")

    class Meta:
        model = Tool
        fields = ["kind", "enabled"]
