"""Erasing a session's flow runs (``agents/erasure.py``): node rows keep kind, status, attempts, times and the child
run's link, and lose what passed through them (``inputs``, ``output``, ``error``)."""

from __future__ import annotations

from typing import Any

from flows.models import FlowNodeRun


def erase_nodes(run_ids: list[Any]) -> int:
    return FlowNodeRun.objects.filter(run_id__in=run_ids).update(inputs={}, output=None, error="")
