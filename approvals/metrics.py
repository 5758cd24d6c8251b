"""The approvals' own counter (the queue gauges are read at scrape time: ``agents.metrics.ApprovalQueueCollector``)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from prometheus_client import Counter

APPROVAL_DECISIONS = Counter("agentops_approval_decisions", "Approval requests decided, by outcome.", ["outcome"])


def record_decision(outcome: Any) -> None:
    """Count a decision once its transaction commits."""
    label = (str(outcome) if outcome not in (None, "") else "unknown")[:100]
    transaction.on_commit(lambda: APPROVAL_DECISIONS.labels(outcome=label).inc())
