"""Issue #49 hole 6: a tenant's bound on running work (agents/capacity.py). One tenant's runs beyond its bound are
parked (not executed, not lost, not failed) and run when a place frees; another tenant's run starts at once; the count
comes from the lease rows, so a dead worker's place is free again when its lease lapses. (Runs had no bound: eight
slow runs of one tenant took every worker slot and another tenant's short run waited behind them.)"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from accounts import services as tenant_services
from agents import services
from agents.models import Run, RunStatus
from core.errors import Forbidden, Invalid
from tenants.models import Tenant
from tenants.scoping import actor_for_api_key, actor_for_user
from tests.factories import World, make_user, make_world


class SlowLoops:
    """Stands in for the agent loop (``agents.engine.build_loop``): each run takes ``seconds`` and ends with an answer;
    records how many of each tenant's runs execute at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.now: dict[int, int] = {}
        self.most: dict[int, int] = {}
        self.began: dict[str, float] = {}

    def build(self, run: Run, token: str) -> Any:
        loops = self

        class Loop:
            def run(self, run_id: str) -> None:
                with loops.lock:
                    loops.began[run_id] = time.monotonic()
                    loops.now[run.tenant_id] = loops.now.get(run.tenant_id, 0) + 1
                    loops.most[run.tenant_id] = max(loops.most.get(run.tenant_id, 0), loops.now[run.tenant_id])
                try:
                    time.sleep(loops.seconds)
                finally:
                    with loops.lock:
                        loops.now[run.tenant_id] -= 1
                Run.objects.filter(pk=run_id, lease_token=token).update(
                    status=RunStatus.FINISHED, phase="finished", terminal_reason="final_answer", output="done",
                    finished_at=timezone.now(), lease_token="", lease_expires_at=None)
                run.status, run.lease_token = RunStatus.FINISHED, ""

        return Loop()


@pytest.fixture
def loops(monkeypatch: pytest.MonkeyPatch) -> SlowLoops:
    import agents.engine

    slow = SlowLoops(0.6)
    monkeypatch.setattr(agents.engine, "build_loop", slow.build)
    return slow


@pytest.fixture
def requeued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    """The tasks parked runs put back on the queue (run id, countdown), kept here instead of the broker."""
    from agents.tasks import execute_run_task

    calls: list[tuple[str, float]] = []
    lock = threading.Lock()

    def apply_async(args: tuple[str], kwargs: Any = None, countdown: float | None = None, **options: Any) -> None:
        if countdown is not None:  # not a new run's first enqueue (delay)
            with lock:
                calls.append((args[0], countdown))

    monkeypatch.setattr(execute_run_task, "apply_async", apply_async)
    return calls


def _runs(world: World, count: int) -> list[str]:
    actor = actor_for_api_key(world.key)
    return [str(services.start_run(actor=actor, agent=world.agent, text="where is order O202411280001?").pk)
            for _ in range(count)]


def _execute_at_once(run_ids: list[str]) -> list[threading.Thread]:
    """What a worker's task threads do: each run's task at the same moment, on its own connection."""

    def task(run_id: str) -> None:
        try:
            services.execute_run(run_id)
        finally:
            connection.close()

    threads = [threading.Thread(target=task, args=(run_id,)) for run_id in run_ids]
    for thread in threads:
        thread.start()
    return threads


@pytest.mark.django_db(transaction=True)
def test_a_tenant_over_its_bound_runs_at_most_its_bound_the_rest_park_and_another_tenant_starts_at_once(
        loops: SlowLoops, requeued: list[tuple[str, float]], settings: Any) -> None:
    settings.TENANT_MAX_RUNNING = 2
    busy, other = make_world(), make_world()
    flood = _runs(busy, 6)
    threads = _execute_at_once(flood)
    time.sleep(0.2)  # the flood's tasks have taken their places or parked
    [short] = _runs(other, 1)
    asked = time.monotonic()
    services.execute_run(short)  # the busy tenant is at its bound: this one is not held behind it
    assert loops.began[short] - asked < 0.3
    for thread in threads:
        thread.join(10)
    assert loops.most[busy.tenant.pk] == 2, f"{loops.most[busy.tenant.pk]} of the busy tenant's runs at once, bound 2"
    parked = sorted({run_id for run_id, _ in requeued})
    assert len(parked) == 4 and set(parked) < set(flood)
    assert {countdown for _, countdown in requeued} == {settings.TENANT_PARK_SECONDS}
    for run in Run.objects.filter(pk__in=parked):  # parked: not executed, not failed, no lease held
        assert (run.status, run.lease_token, run.started_at) == (RunStatus.QUEUED, "", None)
    while pending := [r for r in flood if Run.objects.get(pk=r).status != RunStatus.FINISHED]:  # the parked tasks return
        requeued.clear()
        for thread in _execute_at_once(pending):
            thread.join(10)
    assert loops.most[busy.tenant.pk] == 2
    assert set(Run.objects.filter(pk__in=[*flood, short]).values_list("terminal_reason", flat=True)) == {"final_answer"}


@pytest.mark.django_db
def test_a_place_is_counted_from_live_leases_so_a_dead_worker_s_frees_when_its_lease_lapses(
        loops: SlowLoops, requeued: list[tuple[str, float]], settings: Any,
        django_capture_on_commit_callbacks: Any) -> None:
    settings.TENANT_MAX_RUNNING = 3
    loops.seconds = 0
    world = make_world()
    tenant_services.update_tenant(tenant=world.tenant, actor=None, max_running=1)  # its own bound, below the default
    held, waiting = _runs(world, 2)
    # a worker took the first run and died: its lease is alive for a while yet
    Run.objects.filter(pk=held).update(status=RunStatus.RUNNING, lease_token="dead-worker",
                                       lease_expires_at=timezone.now() + dt.timedelta(seconds=60))
    with django_capture_on_commit_callbacks(execute=True):
        services.execute_run(waiting)
    assert Run.objects.get(pk=waiting).status == RunStatus.QUEUED and requeued == [(waiting, settings.TENANT_PARK_SECONDS)]
    with django_capture_on_commit_callbacks(execute=True):
        services.execute_run(waiting, parked=1)  # parked again: it comes back later each time, up to a bound
        services.execute_run(waiting, parked=9)
    assert [c for _, c in requeued[1:]] == [2 * settings.TENANT_PARK_SECONDS, settings.TENANT_PARK_MAX_SECONDS]
    Run.objects.filter(pk=held).update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))  # it lapsed
    services.execute_run(waiting)
    assert Run.objects.get(pk=waiting).terminal_reason == "final_answer"
    services.execute_run(held)  # the dead worker's run resumes in turn (a crash counted)
    assert Run.objects.filter(pk=held).values_list("terminal_reason", "crash_count").get() == ("final_answer", 1)


@pytest.mark.django_db
def test_a_tenant_s_bound_is_the_platform_s_to_set_and_checked(settings: Any) -> None:
    world = make_world()
    root = actor_for_user(make_user(is_superuser=True, is_staff=True))
    tenant = tenant_services.update_tenant(tenant=world.tenant, actor=root, max_running=5)
    assert Tenant.objects.get(pk=tenant.pk).max_running == 5
    for bad in (0, -1, 1001, "3", 2.5, True):
        with pytest.raises(Invalid) as refused:
            tenant_services.update_tenant(tenant=world.tenant, actor=root, max_running=bad)
        assert refused.value.field == "max_running" and "from 1 to 1000" in str(refused.value)
    owner = make_user()
    tenant_services.set_membership(tenant=world.tenant, user=owner, role="owner", actor=None)
    with pytest.raises(Forbidden):  # an owner may not widen what the platform grants the tenant
        tenant_services.update_tenant(tenant=world.tenant, actor=actor_for_user(owner), max_running=50)
    tenant_services.update_tenant(tenant=world.tenant, actor=root, max_running=None)  # back to the deployment's
    assert Tenant.objects.get(pk=tenant.pk).max_running is None


@pytest.mark.django_db
def test_a_tenant_s_agent_runs_and_flow_nodes_share_its_bound(
        loops: SlowLoops, requeued: list[tuple[str, float]], settings: Any,
        django_capture_on_commit_callbacks: Any) -> None:
    """A flow's nodes start only in what the tenant's running agent runs leave, and an agent run waits while the
    tenant's nodes fill its bound (FLOW_TENANT_MAX_NODES counted nodes alone, and agent runs had no bound)."""
    from flows.runner import advance
    from tests.db.test_flow_runs import ORDER, in_flight, lookup, make_flow, start

    settings.TENANT_MAX_RUNNING = 2
    loops.seconds = 0
    world = make_world()
    [busy, waiting] = _runs(world, 2)
    Run.objects.filter(pk=busy).update(status=RunStatus.RUNNING, lease_token="a-worker",  # a worker executes it
                                       lease_expires_at=timezone.now() + dt.timedelta(seconds=60))
    make_flow(world, {"nodes": [lookup("a"), lookup("b"), lookup("c")], "max_parallel": 3})
    flow_run = start(world, {"flow": "desk", "input": {"order_id": ORDER}}).json()["id"]
    services.execute_run(flow_run)
    assert [n for n, _ in in_flight(Run.objects.get(pk=flow_run))] == ["a"]  # one place left of two
    Run.objects.filter(pk=busy).update(status=RunStatus.FINISHED, lease_token="", lease_expires_at=None)
    with django_capture_on_commit_callbacks(execute=True):
        services.execute_run(waiting)  # the flow's node holds one place: one is free
    assert Run.objects.get(pk=waiting).terminal_reason == "final_answer"
    advance(flow_run)  # what the sweeper's next look at the run does: a second node takes the free place
    assert [n for n, _ in in_flight(Run.objects.get(pk=flow_run))] == ["a", "b"]
    [late] = _runs(world, 1)
    with django_capture_on_commit_callbacks(execute=True):
        services.execute_run(late)  # two nodes running: the tenant is at its bound
    assert Run.objects.get(pk=late).status == RunStatus.QUEUED and [r for r, _ in requeued] == [late]


@pytest.mark.django_db
def test_the_admin_sets_a_tenant_s_bound_through_the_service_and_refuses_a_bad_one() -> None:
    from django.test import Client
    from django.urls import reverse

    from audit.models import ConfigChange

    world = make_world()
    client = Client()
    client.force_login(make_user(is_superuser=True, is_staff=True))
    url = reverse("admin:tenants_tenant_change", args=[world.tenant.pk])
    form = {"name": world.tenant.name, "slug": world.tenant.slug, "is_active": "on", "settings": "{}",
            "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
            "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000"}
    refused = client.post(url, {**form, "max_running": "0"})
    assert refused.status_code == 200 and "greater than or equal to 1" in refused.content.decode()
    assert client.post(url, {**form, "max_running": "2"}).status_code == 302
    assert Tenant.objects.get(pk=world.tenant.pk).max_running == 2
    changed = ConfigChange.objects.filter(tenant=world.tenant, action="tenant.changed").latest("id")
    assert "max_running" in changed.details["changed"]
    owner = make_user(is_staff=True)
    tenant_services.set_membership(tenant=world.tenant, user=owner, role="owner", actor=None)
    client.force_login(owner)
    page = client.get(url)  # what the platform grants: its owner sees it, may not widen it
    assert page.status_code == 200 and 'name="max_running"' not in page.content.decode()
