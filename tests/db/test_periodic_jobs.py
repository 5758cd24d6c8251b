"""Two beats by mistake: the sweeper, approval expiry and the release guards act on each row once.

Each job is run twice at once in two ways: nested (a second run, start to end, inside the first
one's window between reading its rows and changing them; deterministic, one connection) and in two
threads with their own connections. Either way each stranded run is re-enqueued once, each overdue
request expires once (one audit row, one resume) and each tripped guard rolls back once. On top,
the periodic tasks take a short per-job lock, so a second beat's copy does no work at all.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from agents import services as run_services
from agents import sweeper
from agents.models import AgentVersion, Run, RunStatus, Session
from agents.sweeper import sweep_runs
from agents.tasks import sweep_runs_task
from approvals import decisions as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.tasks import expire_approvals_task
from audit.models import ConfigChange
from core.joblock import beat_interval, job_lock
from marketplace import rollouts as release
from marketplace.models import ReleaseWeight
from marketplace.tasks import check_release_guards_task
from tenants.scoping import actor_for_user
from tests.factories import World, make_world

T = TypeVar("T")


def interleave(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, second_run: Callable[[], Any], *, after: bool) -> list[Any]:
    """The first call of ``module.name`` runs ``second_run`` to the end, before or after itself."""
    real = getattr(module, name)
    results: list[Any] = []

    def racing(*args: Any, **kwargs: Any) -> Any:
        if results:
            return real(*args, **kwargs)
        results.append(None)
        if not after:
            results[0] = second_run()
            return real(*args, **kwargs)
        value = real(*args, **kwargs)
        results[0] = second_run()
        return value

    monkeypatch.setattr(module, name, racing)
    return results


def at_once(job: Callable[[], T]) -> list[T]:
    """Run ``job`` in two threads (two connections) released together."""
    barrier = threading.Barrier(2)
    results: list[T] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(job())
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    sent: list[str] = []
    lock = threading.Lock()

    def delay(run_id: str) -> None:
        with lock:
            sent.append(run_id)

    monkeypatch.setattr("agents.tasks.execute_run_task.delay", delay)
    yield sent


@pytest.fixture
def resumed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def resume_run(run_id: Any) -> bool:
        calls.append(str(run_id))
        return True

    monkeypatch.setattr(approvals, "resume_run", resume_run)
    return calls


@pytest.fixture(autouse=True)
def no_locks_left() -> Iterator[None]:
    yield
    for task in ("agents.sweep_runs", "tools.expire_approvals", "marketplace.tasks.check_release_guards_task"):
        cache.delete(f"job-lock:{settings.CELERY_TASK_DEFAULT_QUEUE}:{task}")


# -- set-up ---------------------------------------------------------------------------------------


def stranded(world: World) -> list[str]:
    """Two runs whose worker died and two whose enqueue was lost."""
    now = timezone.now()
    long_ago = now - dt.timedelta(seconds=settings.SWEEP_QUEUED_AFTER_SECONDS * 2)
    ids = []
    for fields in (
        {"status": RunStatus.RUNNING, "lease_token": "t", "lease_expires_at": now - dt.timedelta(seconds=5),
         "updated_at": now - dt.timedelta(seconds=10)},
        {"status": RunStatus.RUNNING, "lease_token": "t", "lease_expires_at": long_ago, "updated_at": long_ago},
        {"updated_at": long_ago, "created_at": long_ago},
        {"updated_at": long_ago, "created_at": long_ago},
    ):
        run = run_services.start_run(actor=actor_for_user(world.operator), agent=world.agent, text="check my orders")
        Run.objects.filter(pk=run.pk).update(**fields)
        ids.append(str(run.pk))
    return ids


def overdue_requests(world: World, count: int = 3) -> list[ApprovalRequest]:
    requests = []
    for index in range(count):
        run = run_services.start_run(actor=actor_for_user(world.operator), agent=world.agent, text="refund order O202411280001")
        Run.objects.filter(pk=run.pk).update(status=RunStatus.WAITING)
        requests.append(
            ApprovalRequest.objects.create(
                tenant=world.tenant, run=run, step=1, call_id=f"call-{index}", tool_name="refund_order",
                arguments={"order_id": "O202411280001"}, arguments_hash="0" * 64,
                expires_at=timezone.now() - dt.timedelta(seconds=1),
            )
        )
    return requests


def tripped_guard(world: World) -> None:
    """A candidate v2 at 10 % whose error rate is far above its guard's threshold."""
    v2 = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner",
                                     system_prompt="v2", tools=world.version.tools, policy=world.version.policy)
    release.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor_for_user(world.operator))
    release.set_release_guard(agent=world.agent, metric="error_rate", threshold=0.2, window=20, min_runs=5,
                              actor=actor_for_user(world.operator))
    for _ in range(6):
        session = Session.objects.create(tenant=world.tenant, agent=world.agent)
        Run.objects.create(tenant=world.tenant, agent=world.agent, version=v2, session=session, input="x",
                           status=RunStatus.FINISHED, terminal_reason="error", finished_at=timezone.now(), usage={})


def assert_rolled_back_once(world: World) -> None:
    assert ConfigChange.objects.filter(action="release.rolled_back", target_id=str(world.agent.pk)).count() == 1
    weights = dict(ReleaseWeight.objects.filter(agent=world.agent).values_list("version__number", "weight"))
    assert weights == {1: 100, 2: 0}


def assert_expired_once(requests: list[ApprovalRequest], resumed: list[str]) -> None:
    for request in requests:
        assert ConfigChange.objects.filter(action="approval.expired", target_id=str(request.pk)).count() == 1
        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.EXPIRED
    assert sorted(resumed) == sorted(str(r.run_id) for r in requests)


# -- the same job twice, nested -------------------------------------------------------------------


@pytest.mark.django_db
def test_two_sweeps_at_once_re_enqueue_each_stranded_run_once(
    monkeypatch: pytest.MonkeyPatch, enqueued: list[str], django_capture_on_commit_callbacks: Any
) -> None:
    # given stranded runs, and a second sweep that runs between the first one's read and its marks
    ids = stranded(make_world())
    enqueued.clear()
    second = interleave(monkeypatch, sweeper, "stranded_runs", sweep_runs, after=True)
    # when
    with django_capture_on_commit_callbacks(execute=True):
        first = sweep_runs()
    # then each run was re-enqueued once, by one of the two sweeps
    assert sorted(enqueued) == sorted(ids)
    assert first.requeued + second[0].requeued == len(ids)


@pytest.mark.django_db
def test_two_expiries_at_once_expire_each_request_once(
    monkeypatch: pytest.MonkeyPatch, resumed: list[str], django_capture_on_commit_callbacks: Any
) -> None:
    requests = overdue_requests(make_world())
    second = interleave(monkeypatch, approvals, "expire", approvals.expire_due, after=False)
    with django_capture_on_commit_callbacks(execute=True):
        first = approvals.expire_due()
    assert_expired_once(requests, resumed)
    assert first + second[0] == len(requests), "each run counts only the requests it expired"


@pytest.mark.django_db
def test_two_guard_checks_at_once_roll_back_once(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    tripped_guard(world)
    second = interleave(monkeypatch, release, "rollback_version", release.check_release_guards, after=False)
    first = release.check_release_guards()
    assert len(first) + len(second[0]) == 1
    assert_rolled_back_once(world)


# -- the same job twice, in two threads -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_in_two_threads_re_enqueue_each_stranded_run_once(enqueued: list[str]) -> None:
    ids = stranded(make_world())
    enqueued.clear()
    reports = at_once(sweep_runs)
    assert sorted(enqueued) == sorted(ids)
    assert sum(r.requeued for r in reports) == len(ids)


@pytest.mark.django_db(transaction=True)
def test_two_expiries_in_two_threads_expire_each_request_once(resumed: list[str]) -> None:
    requests = overdue_requests(make_world())
    counts = at_once(approvals.expire_due)
    assert_expired_once(requests, resumed)
    assert sum(counts) == len(requests)


@pytest.mark.django_db(transaction=True)
def test_two_guard_checks_in_two_threads_roll_back_once() -> None:
    world = make_world()
    tripped_guard(world)
    trips = at_once(release.check_release_guards)
    assert sum(len(t) for t in trips) == 1
    assert_rolled_back_once(world)


# -- the per-job lock -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_second_beats_sweep_finds_the_lock_held_and_does_nothing(enqueued: list[str], django_capture_on_commit_callbacks: Any) -> None:
    ids = stranded(make_world())
    enqueued.clear()
    with job_lock("agents.sweep_runs") as mine, django_capture_on_commit_callbacks(execute=True):
        assert mine
        assert sweep_runs_task() == 0
    assert enqueued == []
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_runs_task() == len(ids)  # the lock was released: the next beat's sweep works
    assert sorted(enqueued) == sorted(ids)


@pytest.mark.django_db
def test_a_second_beats_expiry_finds_the_lock_held_and_does_nothing(resumed: list[str], django_capture_on_commit_callbacks: Any) -> None:
    requests = overdue_requests(make_world())
    with job_lock("tools.expire_approvals"):
        assert expire_approvals_task() == 0
    assert not ConfigChange.objects.filter(action="approval.expired").exists()
    with django_capture_on_commit_callbacks(execute=True):
        assert expire_approvals_task() == len(requests)
    assert_expired_once(requests, resumed)


@pytest.mark.django_db
def test_a_second_beats_guard_check_finds_the_lock_held_and_does_nothing() -> None:
    world = make_world()
    tripped_guard(world)
    with job_lock("marketplace.tasks.check_release_guards_task"):
        assert check_release_guards_task() == 0
    assert not ConfigChange.objects.filter(action="release.rolled_back").exists()
    assert check_release_guards_task() == 1
    assert_rolled_back_once(world)


def test_the_lock_lives_one_beat_interval_and_a_cache_outage_does_not_stop_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    assert beat_interval("agents.sweep_runs") == settings.SWEEP_INTERVAL_SECONDS
    assert beat_interval("tools.expire_approvals") == 15.0
    with job_lock("tools.expire_approvals") as first, job_lock("tools.expire_approvals") as second:
        assert (first, second) == (True, False)

    def down(*args: Any, **kwargs: Any) -> bool:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(cache, "add", down)
    with job_lock("tools.expire_approvals") as mine:
        assert mine, "without the cache the job runs: its rows are claimed one by one anyway"
