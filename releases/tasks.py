from __future__ import annotations

from celery import shared_task

from core.joblock import job_lock


@shared_task(name="releases.replay_shard", acks_late=True, ignore_result=True)
def replay_shard_task(batch_id: int, shard: int, shards: int) -> None:
    from releases.services import run_shard

    run_shard(batch_id, shard, shards)


@shared_task(name="releases.sweep_replays", ignore_result=True)
def sweep_replays_task() -> int:
    """Celery beat runs this every SWEEP_INTERVAL_SECONDS; a second beat's copy finds the job's lock held."""
    from releases.sweeper import finish_batches, sweep_replays

    with job_lock("releases.sweep_replays") as mine:
        return len(sweep_replays()) + len(finish_batches()) if mine else 0
