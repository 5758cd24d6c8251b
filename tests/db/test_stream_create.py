"""A create that streams (POST /api/v1/runs with ``Accept: text/event-stream``) joins the run's feed before the run is
enqueued, so a delta the worker publishes the instant it starts reaches the client (deltas are not stored).

The real view, stream and channel layer; the worker is replaced by a ``deliver`` that publishes, at once, the first
delta (offset 0) and the run's last event through ``core.live`` as the worker does, after noting whether the
stream was already in the run's feed.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import channels.db
import pytest
from rest_framework.test import APIClient

from agents import acceptance, run_feeds
from agents.models import Run, RunStatus
from core import live
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db


def test_the_stream_joins_the_runs_feed_before_the_run_is_enqueued(monkeypatch: pytest.MonkeyPatch,
                                                                    django_capture_on_commit_callbacks: Any) -> None:
    world: World = make_world()
    delivered: list[bool] = []

    def deliver(run_id: Any) -> bool:
        group = live.run_group(run_id)
        listening = any(feed.group == group and feed.watchers for feed in run_feeds._feeds.values())
        delivered.append(listening)
        if listening:  # the worker answers at once: its first delta, then the run's last event
            live.publish_run_delta(run_id=run_id, frame={"type": "message.delta", "step": 1, "attempt": 1, "offset": 0,
                                                         "text": "Your order "})
            live.publish_run_events(run_id=run_id, tenant_id=world.tenant.pk, summary={},
                                    frames=[{"seq": 1, "step": 1, "type": "run.finished", "payload": {}}])
        else:  # nobody listens yet (what this test guards against): end the run so the stream ends
            Run.objects.filter(pk=run_id).update(status=RunStatus.FINISHED)
        return True

    monkeypatch.setattr(acceptance, "deliver", deliver)
    # the stream's reads keep the test's connection (channels closes "old" connections around each one)
    monkeypatch.setattr(channels.db, "close_old_connections", lambda: None)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/api/v1/runs", {"agent": "order-assistant", "input": "where is order O202411280001?"},
                               format="json", HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 202 and response["Content-Type"].startswith("text/event-stream")
    assert delivered == []  # not enqueued by the request: by its stream, once that has joined
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # WSGI consumes the async stream whole (the ASGI server streams it)
        body = b"".join(response).decode()
    assert Run.objects.get(pk=response["X-Run-Id"]).status == RunStatus.QUEUED  # enqueued, not run, by this fake
    response.close()  # (its closer finds the run enqueued already: once)
    frames = [json.loads(line.removeprefix("data: ")) for line in body.splitlines() if line.startswith("data: ")]
    assert delivered == [True]
    assert [f["type"] for f in frames] == ["message.delta", "run.finished"]
    assert frames[0]["offset"] == 0 and frames[0]["text"] == "Your order "


def test_a_streamed_create_whose_stream_never_starts_is_enqueued_when_the_response_closes(
        monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    world: World = make_world()
    delivered: list[Any] = []
    monkeypatch.setattr(acceptance, "deliver", lambda run_id: delivered.append(run_id) or True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/api/v1/runs", {"agent": "order-assistant", "input": "hello", "stream": True}, format="json")
    assert response.status_code == 202 and delivered == []
    response.close()  # the client went away before the first byte: the run starts all the same, once
    response.close()
    assert [str(r) for r in delivered] == [response["X-Run-Id"]]
