"""Issue #50: /healthz names the workers it sees on the deployment's queue against how many are expected, so one
worker that exited is reported while another lives (it was "ok" with any worker alive)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from config import health


@pytest.fixture
def production(settings: Any) -> Any:
    settings.EMBEDDED = False
    settings.WORKERS_EXPECTED = 2
    return settings


def test_one_worker_of_two_is_a_degraded_health_naming_the_survivor(production: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(health, "seen_workers", lambda: ["w1@host"])
    check = health._timed(health._workers)
    assert not check["ok"]
    assert "1 of 2 expected workers seen on queue" in check["detail"] and "w1@host" in check["detail"]


def test_every_expected_worker_seen_is_ok_and_listed(production: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(health, "seen_workers", lambda: ["w1@host", "w2@host"])
    check = health._timed(health._workers)
    assert check["ok"] and check["detail"].startswith("2 of 2 expected seen") and "w2@host" in check["detail"]


@pytest.mark.django_db
def test_the_page_stays_up_but_degraded_when_a_worker_is_missing(production: Any, monkeypatch: Any, rf: Any) -> None:
    monkeypatch.setattr(health, "seen_workers", lambda: ["w1@host"])
    for name in ("_broker", "_channel_layer"):
        monkeypatch.setattr(health, name, lambda: "redis")
    response = health.healthz(rf.get("/healthz"))
    body = json.loads(response.content)
    assert response.status_code == 200 and body["status"] == "degraded" and body["down"] == ["workers"], body
