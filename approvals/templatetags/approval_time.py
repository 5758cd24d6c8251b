"""``{{ seconds|time_left }}``: "58 min" rather than "3532 s" (see :mod:`approvals.timeleft`)."""

from __future__ import annotations

from django import template

from approvals.timeleft import humanize_seconds

register = template.Library()


@register.filter
def time_left(seconds: float | int | None) -> str:
    return humanize_seconds(seconds)
