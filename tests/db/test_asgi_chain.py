"""Issue #14, goal 2: the production ASGI app runs Django's middleware chain synchronously (config/handler.py, one
thread hop per request) and nothing the chain enforced got lost: sessions still need CSRF on the API, the CSP and
other security headers are still set, metrics still count API requests, API keys and tenancy still decide."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client
from django.utils.module_loading import import_string
from prometheus_client import REGISTRY

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
