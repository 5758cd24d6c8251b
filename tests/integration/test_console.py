"""The console on the live stack: session login, the live run list and trace sockets, tenancy, /metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from agents.models import RunEvent
from tests.factories import World, make_world
from tests.integration.wsclient import read_run_frames, recv_frame

pytestmark = pytest.mark.integration

PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="module")
def worlds(live_stack: Any, django_db_blocker: Any) -> tuple[World, World]:
    with django_db_blocker.unblock():
        return make_world(), make_world()


@contextmanager
def login(live_stack: Any, username: str, password: str = PASSWORD) -> Iterator[httpx.Client]:
    """An httpx client holding a console session, logged in through the login form (with its CSRF token)."""
    with httpx.Client(base_url=live_stack.base_url, timeout=20) as http:
        http.get("/accounts/login/")
        response = http.post(
            "/accounts/login/",
            data={
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": http.cookies["csrftoken"],
                "next": "/console/runs/",
            },
        )
        assert response.status_code == 302 and response.headers["location"] == "/console/runs/", response.text[:500]
        yield http


def session_headers(live_stack: Any, http: httpx.Client, origin: str | None = None) -> dict[str, str]:
    return {"Cookie": f"sessionid={http.cookies['sessionid']}", "Origin": origin or live_stack.base_url}


def start(live_stack: Any, key: str, text: str = "where is order O202411280001?") -> str:
    with live_stack.client(key) as http:
        response = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": text})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_console_pages_need_a_login_and_a_foreign_run_is_a_404(live_stack: Any, worlds: Any) -> None:
    world_a, world_b = worlds
    run_b = start(live_stack, world_b.raw_key)
    with httpx.Client(base_url=live_stack.base_url, timeout=20) as anonymous:
        assert anonymous.get("/console/runs/").headers["location"].startswith("/accounts/login/")
    with login(live_stack, world_a.operator.username) as http:
        assert http.get("/console/runs/").status_code == 200
        assert http.get(f"/console/runs/{run_b}/").status_code == 404
        own = start(live_stack, world_a.raw_key)
        page = http.get(f"/console/runs/{own}/")
        assert page.status_code == 200 and "Content-Security-Policy" in page.headers
        css = http.get("/static/console/console.css")
        assert css.status_code == 200 and "text/css" in css.headers["content-type"]
        assert http.get("/static/console/trace.js").status_code == 200


def test_the_run_list_socket_refuses_anonymous_api_key_and_cross_site_connections(live_stack: Any, worlds: Any) -> None:
    world, _ = worlds
    url = f"{live_stack.ws_url}/ws/console/runs/"
    with pytest.raises(InvalidStatus), connect(url, open_timeout=10):
        pass
    with pytest.raises(InvalidStatus), connect(url, additional_headers={"Authorization": f"Bearer {world.raw_key}"}, open_timeout=10):
        pass
    with login(live_stack, world.operator.username) as http:
        with (
            pytest.raises(InvalidStatus),
            connect(url, additional_headers=session_headers(live_stack, http, origin="https://evil.example"), open_timeout=10),
        ):
            pass
        with connect(url, additional_headers=session_headers(live_stack, http), open_timeout=10) as ws:
            ws.ping()


def test_the_run_list_socket_streams_the_tenants_runs_and_never_another_tenants(live_stack: Any, worlds: Any) -> None:
    world_a, world_b = worlds
    with (
        login(live_stack, world_a.operator.username) as http,
        connect(f"{live_stack.ws_url}/ws/console/runs/", additional_headers=session_headers(live_stack, http), open_timeout=10) as ws,
    ):
        foreign = start(live_stack, world_b.raw_key)
        own = start(live_stack, world_a.raw_key)
        rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            frame = recv_frame(ws, timeout=max(0.1, deadline - time.monotonic()))
            rows.append(frame["run"])
            if frame["run"]["id"] == own and frame["run"]["status"] == "finished":
                break
        live_stack.wait_for_run(world_b.raw_key, foreign)
        time.sleep(0.5)  # let any late summary of the foreign run arrive (it must not)
        try:
            while True:
                rows.append(recv_frame(ws, timeout=0.5)["run"])
        except TimeoutError:
            pass
    ids = {row["id"] for row in rows}
    assert own in ids and foreign not in ids
    assert all(row["tenant"] == world_a.tenant.slug for row in rows)
    final = [row for row in rows if row["id"] == own][-1]
    assert final["status"] == "finished" and final["terminal_reason"] == "final_answer"
    assert final["agent"] == "order-assistant" and final["tokens"] > 0 and final["url"] == f"/console/runs/{own}/"


def test_the_trace_socket_with_a_session_sends_backlog_then_live_and_resumes_without_gap_or_duplicate(
    live_stack: Any, worlds: Any, unblocked_db: None
) -> None:
    world_a, world_b = worlds
    run_id = start(live_stack, world_a.raw_key, "what is in order O202411280002?")
    url = f"{live_stack.ws_url}/ws/runs/{run_id}/"
    with login(live_stack, world_a.operator.username) as http:
        headers = session_headers(live_stack, http)
        # the first connection reads a few frames and drops; the second resumes after the last seq it saw
        seen: list[dict[str, Any]] = []
        with connect(url + "?after=0", additional_headers=headers, open_timeout=10) as ws:
            while len(seen) < 3:
                seen.append(recv_frame(ws, timeout=20))
        after = seen[-1]["seq"]
        seen += read_run_frames(f"{url}?after={after}", headers=headers)
    seqs = [frame["seq"] for frame in seen]
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    stored = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == stored
    with login(live_stack, world_b.operator.username) as other, pytest.raises(InvalidStatus):
        read_run_frames(url, headers=session_headers(live_stack, other), timeout=5)


def _scrape(live_stack: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with live_stack.client() as http:
        response = http.get("/metrics")
    assert response.status_code == 200
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def _total(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, lbls), v in values.items() if n == name and wanted <= set(lbls))


def test_metrics_scraped_from_the_server_count_the_workers_runs(live_stack: Any, worlds: Any) -> None:
    world, _ = worlds
    before = _scrape(live_stack)
    runs = [start(live_stack, world.raw_key, f"where is order O20241128000{i}?") for i in (1, 2)]
    for run_id in runs:
        live_stack.wait_for_run(world.raw_key, run_id)
    after = _scrape(live_stack)

    def moved(name: str, **labels: str) -> float:
        return _total(after, name, **labels) - _total(before, name, **labels)

    assert moved("agentops_runs_total", agent="order-assistant", status="final_answer") >= 2
    assert moved("agentops_run_steps_count") >= 2
    assert moved("agentops_llm_tokens_total", type="input") > 0
    assert moved("agentops_llm_tokens_total", type="output") > 0
    assert moved("agentops_llm_request_duration_seconds_count") >= 2
    assert moved("agentops_tool_calls_total", outcome="ok") >= 2
    assert moved("agentops_tool_call_duration_seconds_count") >= 2
    assert ("agentops_llm_cost_total", (("model", "demo/planner"),)) in after
    # every label takes a bounded set of values (replays: mode recorded/live, result passed/failed/skipped/error)
    bounded = {"agent", "status", "model", "type", "tool", "outcome", "le", "tenant", "limit", "provider", "mode", "result"}
    for name, labels in after:
        if name.startswith("agentops_"):
            assert {k for k, _ in labels} <= bounded, (name, labels)
