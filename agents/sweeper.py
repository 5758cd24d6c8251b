"""The run sweeper: puts runs back on the queue when their worker or their enqueue was lost.

Two kinds of stranded run:

- ``running`` with an expired lease (or none): its worker died mid-run (SIGKILL, OOM, a lost host).
  Re-enqueued, it resumes from its last committed step; the worker that takes it over counts a
  crash, and a run whose workers died ``services.MAX_CRASHES`` times ends as ``error``.
- ``queued`` with no lease, older than ``SWEEP_QUEUED_AFTER_SECONDS``: its task never reached a
  worker (a broker restart, the in-memory broker of a restarted embedded server).
- ``waiting`` with nothing left to wait for (no pending approval request, no unfinished child run), unchanged for
  ``SWEEP_QUEUED_AFTER_SECONDS``: its last decision committed but the resume that follows it did not (PostgreSQL or
  Redis went away between the two; issue #50's fault suite found a flow run waiting for ever). It is resumed as the
  decision would have resumed it (``services.resume_waiting_run``).

A re-enqueued run is marked (``updated_at``) and not re-enqueued again for
``SWEEP_QUEUED_AFTER_SECONDS``, so a long queue is not flooded with duplicates. Duplicates are
harmless anyway: ``execute_run`` takes the run's lease first, so only one worker executes it.

Two sweeps at once (two beats by mistake, beat plus ``manage.py sweep_runs``) re-enqueue a run
once: each run is claimed by a conditional ``UPDATE`` that repeats the stranded test, so only one
sweep marks it; on PostgreSQL the candidates are also selected ``FOR UPDATE SKIP LOCKED``, so the
second sweep passes over the rows the first is claiming instead of waiting for them.

Runs as the Celery beat task ``agents.sweep_runs`` (every ``SWEEP_INTERVAL_SECONDS``), as
``manage.py sweep_runs``, and as a thread in the embedded server (``config.embedded``).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone

from agents.models import Run, RunStatus
from approvals.models import ApprovalRequest, ApprovalStatus

log = logging.getLogger(__name__)

#: At most this many runs are re-enqueued per sweep (the next sweep takes the rest).
SWEEP_BATCH = 500


@dataclass(frozen=True)
class SweepReport:
    lease_expired: list[str] = field(default_factory=list)
    lost_enqueue: list[str] = field(default_factory=list)
    lost_resume: list[str] = field(default_factory=list)

    @property
    def requeued(self) -> int:
        return len(self.lease_expired) + len(self.lost_enqueue) + len(self.lost_resume)


def _dead(now: dt.datetime) -> QuerySet[Run]:
    quiet_since = now - dt.timedelta(seconds=settings.SWEEP_QUEUED_AFTER_SECONDS)
    swept_lately = Q(updated_at__gte=quiet_since) & (Q(lease_expires_at__isnull=True) | Q(updated_at__gt=F("lease_expires_at")))
    return (
        Run.objects.filter(status=RunStatus.RUNNING)
        .filter(Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True))
        .exclude(swept_lately)
    )


def _lost(now: dt.datetime) -> QuerySet[Run]:
    quiet_since = now - dt.timedelta(seconds=settings.SWEEP_QUEUED_AFTER_SECONDS)
    return Run.objects.filter(status=RunStatus.QUEUED, lease_token="", updated_at__lt=quiet_since)


def unresumed_runs(now: dt.datetime) -> list[str]:
    """Waiting runs with nothing left to wait for: no pending approval request of theirs and no unfinished child run
    (``facts.parent_run``: a supervisor's or a flow node's sub-agent, which resumes its parent when it ends)."""
    quiet_since = now - dt.timedelta(seconds=settings.SWEEP_QUEUED_AFTER_SECONDS)
    pending = ApprovalRequest.objects.filter(run_id=OuterRef("pk"), status=ApprovalStatus.PENDING)
    waiting = [str(pk) for pk in Run.objects.filter(status=RunStatus.WAITING, lease_token="", updated_at__lt=quiet_since)
               .exclude(Exists(pending)).order_by("updated_at").values_list("pk", flat=True)[:SWEEP_BATCH]]
    if not waiting:
        return []
    busy = set(Run.objects.filter(facts__parent_run__in=waiting, status__in=(RunStatus.QUEUED, RunStatus.RUNNING,
                                                                             RunStatus.WAITING))
               .values_list("facts__parent_run", flat=True))
    return [run_id for run_id in waiting if run_id not in busy]


def stranded_runs(now: dt.datetime | None = None, *, lock: bool = False) -> tuple[list[str], list[str]]:
    """(runs whose worker died, runs whose enqueue was lost), oldest first, not re-enqueued lately.

    ``updated_at`` tells a sweep's mark from a step commit: a commit sets it before the lease's
    expiry, a sweep after it (and taking a lease does not touch it). With ``lock`` (inside a
    transaction) the rows are selected ``FOR UPDATE SKIP LOCKED``: rows another sweep is claiming
    are left to it.
    """
    now = now or timezone.now()
    dead, lost = _dead(now).order_by("updated_at"), _lost(now).order_by("created_at")
    if lock:
        dead, lost = dead.select_for_update(skip_locked=True), lost.select_for_update(skip_locked=True)
    return (
        [str(pk) for pk in dead.values_list("pk", flat=True)[:SWEEP_BATCH]],
        [str(pk) for pk in lost.values_list("pk", flat=True)[:SWEEP_BATCH]],
    )


def sweep_runs(now: dt.datetime | None = None) -> SweepReport:
    """Re-enqueue stranded runs (see the module's docstring). Safe to run concurrently and often."""
    from agents.services import resume_waiting_run
    from agents.tasks import execute_run_task

    now = now or timezone.now()
    with transaction.atomic():
        dead, lost = stranded_runs(now, lock=True)
        # Marking a run is what keeps the next sweeps from enqueueing it again right away. The mark
        # repeats the test it was selected by, so of two sweeps at once only one claims each run.
        dead = [run_id for run_id in dead if _dead(now).filter(pk=run_id).update(updated_at=now)]
        lost = [run_id for run_id in lost if _lost(now).filter(pk=run_id).update(updated_at=now)]
        for run_id in dead + lost:
            transaction.on_commit(lambda run_id=run_id: execute_run_task.delay(run_id))
    resumed = [run_id for run_id in unresumed_runs(now) if resume_waiting_run(run_id)]
    for run_id in dead:
        log.warning("run %s: its worker's lease expired without a step commit; re-enqueued to resume from its last step", run_id)
    for run_id in lost:
        log.warning("run %s: queued for over %ss with no worker; re-enqueued", run_id, settings.SWEEP_QUEUED_AFTER_SECONDS)
    for run_id in resumed:
        log.warning("run %s: waiting with nothing left to wait for (its resume was lost); resumed", run_id)
    return SweepReport(dead, lost, resumed)
