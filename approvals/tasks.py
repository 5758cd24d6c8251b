from __future__ import annotations

from celery import shared_task

from approvals import decisions
from config.joblock import job_lock


# The task keeps the name it had in tools/ (the beat schedule and queued messages use it).
@shared_task(name="tools.expire_approvals", ignore_result=True)
def expire_approvals_task() -> int:
    """Expire overdue approval requests; their runs go on with "approval expired".

    A second beat's copy finds the job's lock held and does nothing (and would expire nothing twice anyway)."""
    with job_lock("tools.expire_approvals") as mine:
        return decisions.expire_due() if mine else 0
