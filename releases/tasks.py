from __future__ import annotations

from celery import shared_task


@shared_task(name="releases.replay_shard", acks_late=True, ignore_result=True)
def replay_shard_task(batch_id: int, shard: int, shards: int) -> None:
    from releases.services import run_shard

    run_shard(batch_id, shard, shards)
