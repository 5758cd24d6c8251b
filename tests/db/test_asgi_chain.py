"""Issue #14, goal 2: the production ASGI app runs Django's middleware chain synchronously (config/handler.py, one
thread hop per request) and nothing the chain enforced got lost: sessions still need CSRF on the API, the CSP and
other security headers are still set, metrics still count API requests, API keys and tenancy still decide; a request
runs on one thread borrowed from the process's kept threads, never shared with a request in progress."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.core.signals import request_finished, request_started
from django.test import Client
from django.utils.module_loading import import_string
from prometheus_client import REGISTRY

from config.asgi import application, django_asgi_app
from config.handler import Threads
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


def test_the_chain_is_loaded_synchronously_once() -> None:
    assert not asyncio.iscoroutinefunction(django_asgi_app._middleware_chain)
    # an async-only middleware would be run through async_to_sync on every request: the hops this handler removed
    assert all(getattr(import_string(path), "sync_capable", True) for path in settings.MIDDLEWARE)


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
def seen_threads(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The thread each request's request_started, chain and request_finished ran on, in order."""
    seen: dict[str, list[int]] = {"started": [], "chain": [], "finished": []}

    def on_started(**_: Any) -> None:
        seen["started"].append(threading.get_ident())

    def on_finished(**_: Any) -> None:
        seen["finished"].append(threading.get_ident())

    chain = django_asgi_app.get_response

    def get_response(request: Any) -> Any:
        seen["chain"].append(threading.get_ident())
        time.sleep(float(request.headers.get("X-Test-Sleep", "0")))
        return chain(request)

    request_started.connect(on_started, weak=False)
    request_finished.connect(on_finished, weak=False)
    monkeypatch.setattr(django_asgi_app, "get_response", get_response)
    yield seen
    request_started.disconnect(on_started)
    request_finished.disconnect(on_finished)


def test_a_request_runs_on_one_thread_and_the_next_request_reuses_it(world: World, seen_threads: dict) -> None:
    made = django_asgi_app.threads.made
    for _ in range(5):
        response = _call("GET", "/api/v1/runs", headers={"Authorization": f"Bearer {world.raw_key}"})
        assert response.status_code == 200, response.text
    # request_started, the chain and request_finished (the pooled connection goes back) on the request's one thread
    assert seen_threads["started"] == seen_threads["chain"] == seen_threads["finished"]
    assert threading.get_ident() not in seen_threads["chain"]
    # one after the other: one thread served them all, none was made for them (Django's handler made one per request)
    assert len(set(seen_threads["chain"])) == 1
    assert django_asgi_app.threads.made - made <= 1


def test_requests_in_progress_together_never_share_a_thread(world: World, seen_threads: dict) -> None:
    headers = {"Authorization": f"Bearer {world.raw_key}", "X-Test-Sleep": "0.3"}

    async def together() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=application, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await asyncio.gather(*(http.get("/api/v1/runs", headers=headers) for _ in range(4)))

    responses = asyncio.run(together())
    assert [r.status_code for r in responses] == [200] * 4
    assert len(set(seen_threads["chain"])) == 4  # four at once: four threads
    assert sorted(seen_threads["started"]) == sorted(seen_threads["chain"]) == sorted(seen_threads["finished"])
    # given back: the next four take the same threads, none is made
    made = django_asgi_app.threads.made
    again = asyncio.run(together())
    assert [r.status_code for r in again] == [200] * 4
    assert django_asgi_app.threads.made == made
    assert set(seen_threads["chain"][4:]) == set(seen_threads["chain"][:4])


def test_a_thread_pool_lends_each_executor_to_one_borrower_and_keeps_a_bounded_number_idle() -> None:
    threads = Threads(keep_idle=2)
    first, second, third = threads.borrow(), threads.borrow(), threads.borrow()
    assert len({id(first), id(second), id(third)}) == 3 and threads.made == 3
    for executor in (first, second, third):
        threads.give_back(executor)
    assert threads.borrow() in (first, second) and threads.borrow() in (first, second)
    assert threads.borrow() is not third and threads.made == 4  # the third was let go, not kept
    with pytest.raises(RuntimeError):
        third.submit(lambda: None)  # shut down


def test_an_ordinary_request_is_one_call_on_its_thread(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """request_started, the chain and request_finished in one hop to the request's thread (Django's handler: three)."""
    calls: list[str] = []
    borrow = django_asgi_app.threads.borrow

    def counting_borrow() -> Any:
        executor = borrow()
        if "submit" in vars(executor):  # counted already (lent again)
            return executor
        submit = executor.submit

        def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            calls.append(fn.args[-1].args[0]["path"])  # thread_handler(..., child): child = respond(scope, body)
            return submit(fn, *args, **kwargs)

        monkeypatch.setattr(executor, "submit", counted)
        return executor

    monkeypatch.setattr(django_asgi_app.threads, "borrow", counting_borrow)
    headers = {"Authorization": f"Bearer {world.raw_key}"}
    assert _call("GET", "/api/v1/runs", headers=headers).status_code == 200
    assert _call("GET", "/api/v1/runs/not-a-run", headers=headers).status_code == 404
    assert len(calls) == 2, "\n".join(calls)


def test_a_process_runs_two_requests_chains_at_a_time_and_the_others_wait_their_turn(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REQUEST_THREADS (2): eight requests at once all answered, never more than two in the chain together."""
    assert (django_asgi_app.turns.size, django_asgi_app.turns.turn) == (settings.REQUEST_THREADS, settings.REQUEST_TURN_SECONDS)
    assert settings.REQUEST_THREADS == 2
    lock, now, most = threading.Lock(), [0], [0]
    chain = django_asgi_app.get_response

    def get_response(request: Any) -> Any:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            time.sleep(0.03)  # well inside a turn (0.2 s)
            return chain(request)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(django_asgi_app, "get_response", get_response)
    headers = {"Authorization": f"Bearer {world.raw_key}"}

    async def together() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=application, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await asyncio.gather(*(http.get("/api/v1/runs", headers=headers) for _ in range(8)))

    assert [r.status_code for r in asyncio.run(together())] == [200] * 8
    assert most[0] == 2
