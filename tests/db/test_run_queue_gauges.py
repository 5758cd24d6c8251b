"""``agentops_runs_active`` and ``agentops_run_oldest_idle_seconds``: per tenant and status, one grouped query per scrape."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.metrics import RunQueueCollector
from agents.models import Run, RunStatus
from tests.e2e.builders import make_run
from tests.factories import make_world

pytestmark = pytest.mark.django_db


def _gauges() -> dict[tuple[str, str, str], float]:
    return {(family.name, s.labels["tenant"], s.labels["status"]): s.value
            for family in RunQueueCollector().collect() for s in family.samples}


def test_active_runs_are_counted_and_the_oldest_idle_age_is_reported_per_status() -> None:
    world, other = make_world(), make_world()
    now = timezone.now()
    stale, fresh = make_run(world, status=RunStatus.QUEUED), make_run(world, status=RunStatus.QUEUED)
    make_run(world, status=RunStatus.WAITING)
    make_run(world)  # finished: not active
    make_run(other, status=RunStatus.RUNNING)
    Run.objects.filter(pk=stale.pk).update(updated_at=now - dt.timedelta(seconds=600))
    Run.objects.filter(pk=fresh.pk).update(updated_at=now - dt.timedelta(seconds=5))

    with CaptureQueriesContext(connection) as queries:
        gauges = _gauges()
    assert len(queries) == 1, "one grouped query per scrape"

    slug, theirs = world.tenant.slug, other.tenant.slug
    assert gauges[("agentops_runs_active", slug, "queued")] == 2
    assert gauges[("agentops_runs_active", slug, "waiting")] == 1
    assert gauges[("agentops_runs_active", theirs, "running")] == 1
    assert ("agentops_runs_active", slug, "finished") not in gauges
    assert 600 <= gauges[("agentops_run_oldest_idle_seconds", slug, "queued")] < 660
    assert gauges[("agentops_run_oldest_idle_seconds", theirs, "running")] < 60
