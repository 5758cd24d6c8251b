"""The production ASGI app serves HTTP through Django's own ASGI handler wrapped by our ASGI middleware (issue #51,
docs/decisions/server-layout.md), and nothing the chain enforces got lost: sessions still need CSRF on the API, the
CSP and other security headers are still set, metrics still count API requests, API keys and tenancy still decide; a
request's request_started, view and request_finished run on one thread; an event stream's on the process's one stream
thread (core/stream_thread.py), whatever the number of streams."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.signals import request_finished, request_started
from django.test import Client
from prometheus_client import REGISTRY

from agents.models import Run, RunStatus
from config.asgi import application, django_asgi_app
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db(transaction=True)  # the app serves from its own threads and connections

RUN = {"agent": "order-assistant", "input": "where is order O1?"}


@pytest.fixture
def world() -> World:
    return make_world()


def _call(method: str, path: str, cookies: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=application, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", cookies=cookies) as http:
            return await http.request(method, path, **kwargs)

    return asyncio.run(go())


def _session_cookies(world: World) -> dict[str, str]:
    browser = Client()
    browser.force_login(world.operator)
    return {settings.SESSION_COOKIE_NAME: browser.cookies[settings.SESSION_COOKIE_NAME].value}


def test_http_is_served_by_django_s_own_asgi_handler() -> None:
    assert type(django_asgi_app) is ASGIHandler


def test_an_api_key_read_keeps_the_security_headers_and_is_counted(world: World) -> None:
    def counted() -> float:
        return REGISTRY.get_sample_value("django_http_requests_total_by_view_transport_method_total",
                                         {"view": "run-list", "transport": "http", "method": "GET"}) or 0.0

    before = counted()
    response = _call("GET", "/api/v1/runs", headers={"Authorization": f"Bearer {world.raw_key}"})
    assert response.status_code == 200, response.text
    assert "default-src" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert counted() == before + 1


def test_a_session_cookie_alone_cannot_post_to_the_api_without_the_csrf_token(world: World) -> None:
    cookies = _session_cookies(world)
    refused = _call("POST", "/api/v1/runs", json=RUN, cookies=cookies)
    assert refused.status_code == 403, refused.text
    assert "CSRF" in refused.text
    # the same session with the token (cookie + header, as the console sends it) is let through: it was CSRF that refused
    token = "a" * 32
    accepted = _call("POST", "/api/v1/runs", json=RUN, cookies={**cookies, settings.CSRF_COOKIE_NAME: token},
                     headers={"X-CSRFToken": token, "Origin": "http://127.0.0.1", "Referer": "http://127.0.0.1/console/"})
    assert accepted.status_code == 202, accepted.text


def test_a_bad_key_is_refused_and_another_tenant_s_run_is_not_found(world: World) -> None:
    assert _call("GET", "/api/v1/runs", headers={"Authorization": "Bearer aok_nope_nope"}).status_code == 401
    other = make_world("other")
    created = _call("POST", "/api/v1/runs", json=RUN, headers={"Authorization": f"Bearer {world.raw_key}"})
    assert created.status_code == 202, created.text
    run_id = json.loads(created.text)["id"]
    foreign = _call("GET", f"/api/v1/runs/{run_id}", headers={"Authorization": f"Bearer {other.raw_key}"})
    assert foreign.status_code == 404


@pytest.fixture
def seen_threads() -> Iterator[dict[str, list[tuple[str, int]]]]:
    """The thread each request's request_started and request_finished ran on (with the request's path), in order."""
    seen: dict[str, list[tuple[str, Any]]] = {"started": [], "finished": [], "names": []}

    def on_started(scope: Any = None, **_: Any) -> None:
        seen["started"].append((scope["path"], threading.get_ident()))
        seen["names"].append((scope["path"], threading.current_thread().name))

    def on_finished(**_: Any) -> None:
        seen["finished"].append(("", threading.get_ident()))

    request_started.connect(on_started, weak=False)
    request_finished.connect(on_finished, weak=False)
    yield seen
    request_started.disconnect(on_started)
    request_finished.disconnect(on_finished)


def test_a_request_starts_and_finishes_on_one_thread_off_the_event_loop(world: World, seen_threads: dict) -> None:
    for _ in range(3):
        response = _call("GET", "/api/v1/runs", headers={"Authorization": f"Bearer {world.raw_key}"})
        assert response.status_code == 200, response.text
    started = [ident for _, ident in seen_threads["started"]]
    finished = [ident for _, ident in seen_threads["finished"]]
    # request_finished gives the pooled connection back from the thread that used it
    assert started == finished and threading.get_ident() not in started


def test_event_streams_run_their_django_work_on_the_process_s_one_stream_thread(world: World, seen_threads: dict) -> None:
    """Two streams of a finished run (each ends after its backlog) and a read, at once: both streams' request_started
    ran on the stream thread, the read on a thread of its own."""
    created = _call("POST", "/api/v1/runs", json=RUN, headers={"Authorization": f"Bearer {world.raw_key}"})
    assert created.status_code == 202, created.text
    run_id = json.loads(created.text)["id"]
    Run.objects.filter(pk=run_id).update(status=RunStatus.FINISHED)
    headers = {"Authorization": f"Bearer {world.raw_key}", "Accept": "text/event-stream"}
    seen_threads["started"].clear()
    seen_threads["names"].clear()

    async def together() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=application, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await asyncio.gather(http.get(f"/api/v1/runs/{run_id}/stream", headers=headers),
                                        http.get(f"/api/v1/runs/{run_id}/stream", headers=headers),
                                        http.get("/api/v1/runs", headers={"Authorization": f"Bearer {world.raw_key}"}))

    responses = asyncio.run(together())
    assert [r.status_code for r in responses] == [200] * 3, [r.text[:200] for r in responses]
    assert responses[0].text.startswith(": run stream")
    threads = {path: ident for path, ident in seen_threads["started"]}
    stream_threads = {ident for path, ident in seen_threads["started"] if path.endswith("/stream")}
    assert len(seen_threads["started"]) == 3 and len(stream_threads) == 1, seen_threads["started"]
    assert threads["/api/v1/runs"] not in stream_threads
    names = {name for path, name in seen_threads["names"] if path.endswith("/stream")}
    assert len(names) == 1 and names.pop().startswith("streams"), seen_threads["names"]
