"""Periodic release checks. Thin: the service does the work (and can be called synchronously)."""

from __future__ import annotations

from celery import shared_task

from marketplace.services import check_release_guards


@shared_task(name="marketplace.tasks.check_release_guards_task", ignore_result=True)
def check_release_guards_task() -> int:
    """Roll back candidate versions whose guard tripped; scheduled by Celery beat (CELERY_BEAT_SCHEDULE)."""
    return len(check_release_guards())
