from __future__ import annotations

from celery import shared_task

from config.joblock import job_lock
from tools import approvals


@shared_task(name="tools.expire_approvals", ignore_result=True)
def expire_approvals_task() -> int:
    """Expire overdue approval requests; their runs go on with "approval expired".

    A second beat's copy finds the job's lock held and does nothing (and would expire nothing twice anyway)."""
    with job_lock("tools.expire_approvals") as mine:
        return approvals.expire_due() if mine else 0
