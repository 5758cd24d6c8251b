"""Periodic release checks. Thin: the service does the work (and can be called synchronously)."""

from __future__ import annotations

from celery import shared_task

from core.joblock import job_lock
from marketplace.services import check_release_guards


@shared_task(name="marketplace.tasks.check_release_guards_task", ignore_result=True)
def check_release_guards_task() -> int:
    """Roll back candidate versions whose guard tripped; scheduled by Celery beat (CELERY_BEAT_SCHEDULE).

    A second beat's copy finds the job's lock held and does nothing (and would roll back nothing twice anyway)."""
    with job_lock("marketplace.tasks.check_release_guards_task") as mine:
        return len(check_release_guards()) if mine else 0
