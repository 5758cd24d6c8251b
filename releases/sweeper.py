"""The replay sweeper: enqueues again the replay shards whose worker died or whose message was lost.

A shard (``ReplayShard``) is a durable job with the same discipline as a run (``agents/sweeper.py``):

- leased, lease expired, not finished: its worker died mid-shard. The successor resumes after the last committed
  chunk (``releases.services.run_shard`` skips the members that have results).
- never leased and older than ``SWEEP_QUEUED_AFTER_SECONDS``: its message never reached a worker.

And a batch whose shards have all finished but which is still ``running`` (its last shard's finishing commit was lost:
PostgreSQL went away between the shard's end and the batch's, as issue #50's fault suite found) is finished by the
sweeper, as that shard would have finished it.

A shard is re-enqueued at most once per ``SWEEP_QUEUED_AFTER_SECONDS`` (``swept_at``); duplicates are harmless
anyway, since ``run_shard`` takes the shard's lease first and fences each chunk's commit with it. Runs as the beat
task ``releases.sweep_replays`` (the embedded server runs the beat schedule in a thread too).
"""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, Max, OuterRef, Q, QuerySet
from django.utils import timezone

from releases.models import BatchStatus, ReplayBatch, ReplayShard

log = logging.getLogger(__name__)

SWEEP_BATCH = 200


def _stranded(now: dt.datetime) -> QuerySet[ReplayShard]:
    quiet_since = now - dt.timedelta(seconds=settings.SWEEP_QUEUED_AFTER_SECONDS)
    dead = Q(lease_expires_at__lt=now)
    lost = Q(lease_expires_at__isnull=True, created_at__lt=quiet_since)
    return (ReplayShard.objects.filter(dead | lost, finished_at__isnull=True,
                                       batch__status__in=(BatchStatus.QUEUED, BatchStatus.RUNNING))
            .filter(Q(swept_at__isnull=True) | Q(swept_at__lt=quiet_since)))


def sweep_replays(now: dt.datetime | None = None) -> list[tuple[int, int]]:
    """Re-enqueue stranded shards; returns their (batch, shard). Safe to run concurrently and often."""
    from releases.tasks import replay_shard_task

    now = now or timezone.now()
    with transaction.atomic():
        candidates = list(_stranded(now).order_by("created_at").values_list("pk", "batch_id", "shard", "shards")[:SWEEP_BATCH])
        # The mark repeats the test the shard was selected by: of two sweeps at once, one claims each shard.
        claimed = [(batch, shard, shards) for pk, batch, shard, shards in candidates
                   if _stranded(now).filter(pk=pk).update(swept_at=now)]
        for batch, shard, shards in claimed:
            transaction.on_commit(lambda b=batch, s=shard, n=shards: replay_shard_task.delay(b, s, n))
    for batch, shard, _ in claimed:
        log.warning("replay batch %s shard %s: its worker's lease expired or its message was lost; re-enqueued", batch, shard)
    return [(batch, shard) for batch, shard, _ in claimed]


def unfinished_batches(now: dt.datetime) -> list[int]:
    """Batches still queued or running whose shards have all finished, the last over ``SWEEP_QUEUED_AFTER_SECONDS`` ago."""
    quiet_since = now - dt.timedelta(seconds=settings.SWEEP_QUEUED_AFTER_SECONDS)
    open_shards = ReplayShard.objects.filter(batch_id=OuterRef("pk"), finished_at__isnull=True)
    return list(ReplayBatch.objects.filter(status__in=(BatchStatus.QUEUED, BatchStatus.RUNNING))
                .annotate(last_shard=Max("shards__finished_at")).filter(last_shard__lt=quiet_since)
                .exclude(Exists(open_shards)).order_by("pk").values_list("pk", flat=True)[:SWEEP_BATCH])


def finish_batches(now: dt.datetime | None = None) -> list[int]:
    """Finish the batches :func:`unfinished_batches` finds; returns their ids."""
    from releases.services import _maybe_finish

    done = []
    for batch_id in unfinished_batches(now or timezone.now()):
        _maybe_finish(batch_id)
        if ReplayBatch.objects.filter(pk=batch_id, status=BatchStatus.FINISHED).exists():
            log.warning("replay batch %s: every shard had finished but the batch had not; finished now", batch_id)
            done.append(batch_id)
    return done
