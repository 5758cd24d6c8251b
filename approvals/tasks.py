from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import transaction

from approvals import decisions, notify
from core.joblock import job_lock

log = logging.getLogger(__name__)


# The task keeps the name it had in tools/ (the beat schedule and queued messages use it).
@shared_task(name="tools.expire_approvals", ignore_result=True)
def expire_approvals_task() -> int:
    """Expire overdue approval requests; their runs go on with "approval expired". Then announce the ones that
    expire soon (``APPROVAL_EXPIRY_NOTICE_SECONDS``) on their channels, and send again the deliveries whose task was lost.

    A second beat's copy finds the job's lock held and does nothing (and would expire nothing twice anyway)."""
    with job_lock("tools.expire_approvals") as mine:
        if not mine:
            return 0
        expired = decisions.expire_due()
        for request_id in notify.expiry_notices_due():
            enqueue_notice(request_id, notify.NotifyEvent.EXPIRING)
        for request_id in notify.unannounced_requests():
            for delivery_id in notify.fan_out(request_id, notify.NotifyEvent.ARRIVED):
                deliver_task.delay(delivery_id)
        for delivery_id in notify.stranded_deliveries():
            deliver_task.delay(delivery_id)
        return expired


@shared_task(name="approvals.notify", ignore_result=True)
def notify_task(request_id: str, event: str) -> int:
    """Make the request's deliveries for ``event`` and send each from a worker."""
    ids = notify.fan_out(request_id, event)
    for delivery_id in ids:
        deliver_task.delay(delivery_id)
    return len(ids)


@shared_task(name="approvals.deliver", ignore_result=True)
def deliver_task(delivery_id: int) -> None:
    """One attempt; a failure is tried again after the backoff the row records (``next_attempt_at``)."""
    delay = notify.attempt(delivery_id)
    if delay is not None:
        deliver_task.apply_async((delivery_id,), countdown=delay)


def enqueue_notice(request_id: Any, event: str) -> None:
    """Announce a request once this transaction commits, best effort: a broker that is down is logged, never raised
    into the run's step."""

    def send() -> None:
        try:
            notify_task.delay(str(request_id), str(event))
        except Exception:
            log.exception("could not enqueue the approval notice for %s", request_id)

    transaction.on_commit(send)
