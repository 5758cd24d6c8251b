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
