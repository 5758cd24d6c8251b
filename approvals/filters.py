"""``/approvals`` query parameters (core/filters.py)."""

from __future__ import annotations

import django_filters

from approvals.models import ApprovalRequest, ApprovalStatus
from core.filters import OneOf


class ApprovalFilter(django_filters.FilterSet):
    status = OneOf(values=ApprovalStatus.values, help_text=f"Only requests in this state: {', '.join(ApprovalStatus.values)}.")

    class Meta:
        model = ApprovalRequest
        fields = ["status"]
