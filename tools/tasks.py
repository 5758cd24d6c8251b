from __future__ import annotations

from celery import shared_task

from tools import approvals


@shared_task(name="tools.expire_approvals", ignore_result=True)
def expire_approvals_task() -> int:
    """Expire overdue approval requests; their runs go on with "approval expired"."""
    return approvals.expire_due()
