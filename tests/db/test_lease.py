"""The lease heartbeat: a long step keeps its lease; a lost lease stops the beat."""

from __future__ import annotations

import time

import pytest

from agents import services
from agents.lease import LeaseHeartbeat, renew_lease
from agents.models import Run
from tenants.scoping import actor_for_api_key
from tests.factories import make_world


def test_the_heartbeat_renews_until_stopped() -> None:
    beats: list[float] = []
    with LeaseHeartbeat(lambda: beats.append(time.monotonic()) or True, interval=0.05) as heartbeat:
        time.sleep(0.3)
    count = len(beats)
    time.sleep(0.15)
    assert count >= 3 and heartbeat.beats == count
    assert len(beats) == count, "no beat after the step ended"


def test_the_heartbeat_stops_when_the_lease_is_lost() -> None:
    calls: list[int] = []

    def renew() -> bool:
        calls.append(1)
        return len(calls) < 2

    with LeaseHeartbeat(renew, interval=0.03):
        time.sleep(0.3)
    assert len(calls) == 2


def test_many_heartbeats_share_one_thread_and_each_beats_on_time() -> None:
    """A flow's nodes each hold a heartbeat: twenty at once cost no thread each, and every one of them beats."""
    import contextlib
    import threading

    beats: dict[int, int] = {i: 0 for i in range(20)}

    def renew(i: int) -> bool:
        beats[i] += 1
        return True

    with LeaseHeartbeat(lambda: True, interval=10):
        before = threading.active_count()  # the shared thread exists now
    with contextlib.ExitStack() as stack:
        for i in range(20):
            stack.enter_context(LeaseHeartbeat(lambda i=i: renew(i), interval=0.05))
        assert threading.active_count() < before + 5, "no thread per heartbeat"
        time.sleep(0.35)
    assert all(count >= 3 for count in beats.values()), beats


@pytest.mark.django_db
def test_renew_extends_only_the_holders_lease() -> None:
    world = make_world()
    run = services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="hi")
    taken = services.acquire_lease(str(run.pk), "token-a")
    assert taken is not None
    before = Run.objects.get(pk=run.pk).lease_expires_at
    time.sleep(0.01)
    assert renew_lease(run.pk, "token-a")
    assert Run.objects.get(pk=run.pk).lease_expires_at > before
    assert not renew_lease(run.pk, "token-b"), "another worker's token renews nothing"
