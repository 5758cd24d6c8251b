"""Replays on the live stack (issue #16): a batch started over the API runs on the real worker (a Celery worker
process on Redis in production mode, the server's embedded worker otherwise), its progress readable while it runs,
and a recorded replay of the unchanged version reproduces every run exactly. A second tenant sees 404s."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agents.models import Run, RunEvent
from audit.models import ConfigChange, ToolCallAudit
from releases.models import ReplayBatch, ReplayRun
from tests.factories import World, make_world

pytestmark = pytest.mark.integration

QUESTIONS = ["Where is my order O202411280001?", "What is in order O202411280002?",
             "How much did orders O202411280001 and O202411280002 cost together?", "Hello, who are you?"]


@pytest.fixture(scope="module")
def worlds(live_stack: Any, django_db_blocker: Any) -> tuple[World, World]:
    with django_db_blocker.unblock():
        return make_world(), make_world()


def test_a_batch_runs_on_the_real_worker_and_reproduces_every_run(live_stack: Any, worlds: Any, unblocked_db: None) -> None:
    world, other = worlds
    with live_stack.client(world.raw_key) as http:
        ids = []
        for i in range(8):
            started = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": QUESTIONS[i % len(QUESTIONS)]})
            assert started.status_code == 202, started.text
            ids.append(started.json()["id"])
        for run_id in ids:
            live_stack.wait_for_run(world.raw_key, run_id)
        created = http.post("/api/v1/evaluation-sets", json={"name": "live", "agent": "order-assistant",
                                                             "filters": {"versions": [1], "limit": 100}})
        assert created.status_code == 201, created.text
        assert created.json()["runs"] == 8
        set_id = created.json()["id"]
        counts = (Run.objects.count(), RunEvent.objects.count(), ToolCallAudit.objects.count())
        replay = http.post("/api/v1/replays", json={"evaluation_set": set_id, "candidate": {"agent": "order-assistant",
                                                                                            "version": 1},
                                                    "model_mode": "recorded", "concurrency": 2,
                                                    "checks": [{"check": "no_diff"}]})
        assert replay.status_code == 202, replay.text
        batch_id = replay.json()["id"]
        assert replay.json()["total"] == 8
        seen = set()
        deadline = time.monotonic() + 60
        while True:
            body = http.get(f"/api/v1/replays/{batch_id}").json()
            seen.add((body["status"], body["done"]))
            if body["status"] in ("finished", "failed") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert body["status"] == "finished", (body, live_stack.logdir)
    assert body["done"] == 8 and body["pass_rate"] == 1.0 and body["failed"] == 0, body
    assert all(r["changed"] == [] and r["live_tool_calls"] == 0 for r in body["results"]), body["results"]
    assert sum(1 for r in body["results"] if r["diff"]["tools"]["recorded"]) >= 4
    assert ReplayRun.objects.filter(batch_id=batch_id).count() == 8
    assert (Run.objects.count(), RunEvent.objects.count(), ToolCallAudit.objects.count()) == counts, \
        "the replay wrote no run, event or audit row"
    batch = ReplayBatch.objects.get(pk=batch_id)
    assert batch.started_at is not None and batch.finished_at is not None
    assert set(ConfigChange.objects.filter(tenant=world.tenant, action__startswith="replay.")
               .values_list("action", flat=True)) == {"replay.started", "replay.finished"}
    with live_stack.client(other.raw_key) as theirs:
        assert theirs.get(f"/api/v1/replays/{batch_id}").status_code == 404
        assert theirs.get(f"/api/v1/evaluation-sets/{set_id}").status_code == 404
        refused = theirs.post("/api/v1/replays", json={"evaluation_set": set_id,
                                                       "candidate": {"agent": "order-assistant", "version": 1}})
        assert refused.status_code == 400 and refused.json()["error"]["field"] == "evaluation_set", refused.text
