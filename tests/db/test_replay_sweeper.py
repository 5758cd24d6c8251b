"""Issue #50: a replay shard is a durable job. A shard whose worker died (its lease expired) or whose message was lost
is enqueued again by the sweeper within a sweep interval and resumes after its last committed chunk; a worker that lost
its lease commits nothing, so no result is counted twice; a duplicate message finds the lease held and does nothing."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from agents import services
from releases import services as releases
from releases import tasks
from releases.models import ReplayBatch, ReplayRun, ReplayShard
from releases.sweeper import sweep_replays
from tenants.scoping import Actor, actor_for_user
from tests.factories import make_world

pytestmark = pytest.mark.django_db

QUESTIONS = ["Where is my order O202411280001?", "What is in order O202411280002?", "Where is my order O202411280002?"]


@pytest.fixture
def world() -> Any:
    w = make_world()
    for text in QUESTIONS:
        run = services.start_run(actor=Actor(api_key=w.key), agent=w.agent, text=text)
        services.execute_run(str(run.pk))
    return w


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.replay_shard_task, "delay", lambda *args: sent.append(args))
    return sent


def _batch(w: Any, django_capture_on_commit_callbacks: Any) -> ReplayBatch:
    actor = actor_for_user(w.operator)
    s = releases.create_evaluation_set(tenant=w.tenant, actor=actor, name="sweep", agent=w.agent, filters={"limit": 50})
    with django_capture_on_commit_callbacks(execute=True):
        return releases.start_replay(tenant=w.tenant, actor=actor, evaluation_set=s, candidate=w.version, concurrency=1)


def _expire(batch: ReplayBatch) -> None:
    ReplayShard.objects.filter(batch=batch).update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))


def test_a_shard_whose_worker_died_is_resumed_by_the_sweeper_after_its_last_chunk(
        world: Any, enqueued: list[Any], monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    batch = _batch(world, django_capture_on_commit_callbacks)
    assert enqueued == [(batch.pk, 0, 1)] and ReplayShard.objects.filter(batch=batch).count() == 1
    monkeypatch.setattr(releases, "CHUNK", 1)
    real = releases._replay_chunk
    calls = {"n": 0}

    def killed_after_first_chunk(*args: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise SystemExit("SIGKILL")  # the worker dies mid-shard: no finish, the lease stays until it expires
        real(*args)

    monkeypatch.setattr(releases, "_replay_chunk", killed_after_first_chunk)
    with pytest.raises(SystemExit):
        releases.run_shard(batch.pk, 0, 1)
    monkeypatch.setattr(releases, "_replay_chunk", real)
    batch.refresh_from_db()
    assert batch.status == "running" and batch.done == 1
    assert sweep_replays() == []  # the lease is still live: nothing to sweep yet
    _expire(batch)
    enqueued.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_replays() == [(batch.pk, 0)]
    assert enqueued == [(batch.pk, 0, 1)]
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_replays() == []  # marked: not enqueued again on the next sweep
    releases.run_shard(*enqueued[0])
    batch.refresh_from_db()
    assert batch.status == "finished" and batch.done == batch.total == 3 and batch.passed_count == 3
    assert ReplayRun.objects.filter(batch=batch).count() == 3
    assert ReplayShard.objects.get(batch=batch).finished_at is not None


def test_a_shard_whose_message_was_lost_is_enqueued_again(
        world: Any, enqueued: list[Any], settings: Any, django_capture_on_commit_callbacks: Any) -> None:
    batch = _batch(world, django_capture_on_commit_callbacks)
    enqueued.clear()
    assert sweep_replays() == []  # just created: its message may still be on its way
    ReplayShard.objects.filter(batch=batch).update(
        created_at=timezone.now() - dt.timedelta(seconds=settings.SWEEP_QUEUED_AFTER_SECONDS + 1))
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_replays() == [(batch.pk, 0)]
    releases.run_shard(*enqueued[0])
    batch.refresh_from_db()
    assert batch.status == "finished" and batch.done == 3


def test_a_worker_that_lost_its_lease_commits_nothing_and_a_duplicate_message_does_nothing(
        world: Any, enqueued: list[Any], monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    batch = _batch(world, django_capture_on_commit_callbacks)
    monkeypatch.setattr(releases, "CHUNK", 1)
    real = releases._replay_chunk
    seen = {"n": 0}

    def stalled_then_overtaken(*args: Any) -> None:
        seen["n"] += 1
        if seen["n"] == 1:
            # While the first worker stalls past its lease, the sweeper hands the shard to a second worker,
            # which replays the whole shard. A duplicate message meanwhile finds the lease held.
            monkeypatch.setattr(releases, "_replay_chunk", real)
            _expire(batch)
            releases.run_shard(batch.pk, 0, 1)
        real(*args)

    monkeypatch.setattr(releases, "_replay_chunk", stalled_then_overtaken)
    releases.run_shard(batch.pk, 0, 1)  # the stalled worker: its commit is fenced off, it stops
    batch.refresh_from_db()
    assert batch.status == "finished"
    assert (batch.done, batch.passed_count) == (3, 3), "a result was counted twice"
    assert ReplayRun.objects.filter(batch=batch).count() == 3
    before = ReplayRun.objects.count()
    releases.run_shard(batch.pk, 0, 1)  # a late duplicate message of a finished shard
    assert ReplayRun.objects.count() == before


def test_a_held_lease_turns_a_duplicate_message_away(
        world: Any, enqueued: list[Any], django_capture_on_commit_callbacks: Any) -> None:
    batch = _batch(world, django_capture_on_commit_callbacks)
    assert releases._take_lease(batch.pk, 0, 1) is not None  # another worker is on it
    releases.run_shard(batch.pk, 0, 1)
    batch.refresh_from_db()
    assert batch.done == 0 and ReplayRun.objects.filter(batch=batch).count() == 0


def test_a_batch_whose_shards_all_finished_but_not_the_batch_is_finished_by_the_sweeper(
        world: Any, enqueued: list[Any], monkeypatch: pytest.MonkeyPatch, settings: Any,
        django_capture_on_commit_callbacks: Any) -> None:
    from django.db.utils import OperationalError

    from releases.sweeper import finish_batches

    batch = _batch(world, django_capture_on_commit_callbacks)

    def database_gone(batch_id: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")  # between the shard's end and the batch's

    monkeypatch.setattr(releases, "_maybe_finish", database_gone)
    with pytest.raises(OperationalError):
        releases.run_shard(batch.pk, 0, 1)
    monkeypatch.undo()
    batch.refresh_from_db()
    assert batch.status == "running" and batch.done == batch.total == 3
    assert ReplayShard.objects.get(batch=batch).finished_at is not None
    assert finish_batches() == []  # a moment ago: the shard's own finish may still be on its way
    later = timezone.now() + dt.timedelta(seconds=settings.SWEEP_QUEUED_AFTER_SECONDS + 1)
    assert finish_batches(later) == [batch.pk]
    batch.refresh_from_db()
    assert batch.status == "finished" and batch.pass_rate == 1.0
    assert sweep_replays(later) == []  # and no shard of it is enqueued again
