"""Bad input is a 4xx naming what was wrong (413 for a body over the limit), never a 500 or a run that dies later."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from agents.models import Run
from core.body_limit import BodyLimit
from core.parsers import MAX_JSON_DEPTH
from marketplace.models import PluginInstall
from tests.factories import World

pytestmark = pytest.mark.django_db


def client_for(world: World) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    return client


def post_raw(client: APIClient, url: str, body: str | bytes, method: str = "post") -> Any:
    return getattr(client, method)(url, data=body, content_type="application/json")


def nested(depth: int) -> str:
    return '{"agent": "order-assistant", "input": "hi", "facts": {"a": ' + "[" * depth + "]" * depth + "}}"


# --------------------------------------------------------------------------- body size


def test_a_body_over_the_limit_is_a_413_with_a_json_error(world: World) -> None:
    body = json.dumps({"agent": "order-assistant", "input": "x" * (10 * 1024 * 1024)})
    response = post_raw(client_for(world), "/api/v1/runs", body)
    assert response.status_code == 413
    assert response["Content-Type"].startswith("application/json")
    assert str(settings.DATA_UPLOAD_MAX_MEMORY_SIZE) in response.json()["detail"]
    assert not Run.objects.exists()


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "multipart/form-data; boundary=BoUnDaRy"])
def test_a_form_body_over_the_limit_is_a_413_too(world: World, content_type: str) -> None:
    if content_type.startswith("multipart"):
        body = (b'--BoUnDaRy\r\nContent-Disposition: form-data; name="input"\r\n\r\n' + b"x" * (3 * 1024 * 1024)
                + b'\r\n--BoUnDaRy--\r\n')
    else:
        body = b"agent=order-assistant&input=" + b"x" * (3 * 1024 * 1024)
    response = client_for(world).post("/api/v1/runs", data=body, content_type=content_type)
    assert response.status_code == 413, response.content[:300]
    assert response.json()["detail"].startswith("The request body is larger than")


def test_a_body_just_under_the_limit_still_reaches_validation(world: World) -> None:
    body = json.dumps({"agent": "order-assistant", "input": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE - 100)})
    response = post_raw(client_for(world), "/api/v1/runs", body)
    assert response.status_code == 400
    assert "input" in response.json()


def asgi_call(app: Any, messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    """Drive an ASGI app with the given request messages; what it sent back."""
    sent: list[dict[str, Any]] = []
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/api/v1/runs", "raw_path": b"/api/v1/runs", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"), *headers],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    asyncio.run(app(scope, receive, send))
    return sent


def test_the_asgi_application_refuses_a_declared_body_over_the_limit_before_django_reads_it() -> None:
    from config.asgi import application

    size = 10 * 1024 * 1024
    sent = asgi_call(application, [{"type": "http.request", "body": b"x" * 1024, "more_body": True}],
                     [(b"content-length", str(size).encode())])
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["detail"].startswith(f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")


def test_the_asgi_application_refuses_a_chunked_body_once_it_passes_the_limit() -> None:
    from config.asgi import application

    chunk = {"type": "http.request", "body": b"x" * (1024 * 1024), "more_body": True}
    sent = asgi_call(application, [dict(chunk) for _ in range(10)], [])
    assert sent[0]["status"] == 413


def test_a_chunked_body_within_the_limit_reaches_the_application_whole() -> None:
    seen: list[bytes] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append(body)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    chunks = [{"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.request", "body": b"cd", "more_body": False}]
    sent = asgi_call(BodyLimit(inner, limit=10), chunks, [])
    assert sent[0]["status"] == 204 and seen == [b"abcd"]
    assert asgi_call(BodyLimit(inner, limit=3), chunks, [])[0]["status"] == 413


# --------------------------------------------------------------------------- nesting depth


@pytest.mark.parametrize("url", ["/api/v1/runs", "/api/v1/tools", "/api/v1/tools/query_order/dry-run"])
def test_json_nested_10000_deep_is_a_400(world: World, url: str) -> None:
    response = post_raw(client_for(world), url, nested(10_000))
    assert response.status_code == 400
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in response.json()["detail"]


def test_json_nested_within_the_limit_is_parsed(world: World) -> None:
    body = '{"arguments": {"order_id": "O1", "x": ' + "[" * (MAX_JSON_DEPTH - 4) + "]" * (MAX_JSON_DEPTH - 4) + "}}"
    response = post_raw(client_for(world), "/api/v1/tools/query_order/dry-run", body)
    assert response.status_code == 200, response.content


def test_depth_inside_strings_does_not_count(world: World) -> None:
    response = client_for(world).post("/api/v1/runs", {"agent": "order-assistant", "input": "[" * 5000}, format="json")
    assert response.status_code == 202, response.content


# --------------------------------------------------------------------------- query parameters


MALFORMED_CURSORS = [
    "garbage",
    "cD1ub3QtYS1wb3NpdGlvbg==",  # p=not-a-position
    "cj0xJnA9eA==",  # r=1&p=x
    "bz0tNQ==",  # o=-5
]


@pytest.mark.parametrize("url", ["/api/v1/runs", "/api/v1/audit/tool-calls", "/api/v1/audit/changes", "/api/v1/tools"])
def test_a_malformed_cursor_is_a_400_naming_it(world: World, url: str) -> None:
    client = client_for(world)
    for cursor in MALFORMED_CURSORS:
        response = client.get(url, {"cursor": cursor})
        assert response.status_code == 400, (cursor, response.content)
        assert "cursor" in response.json()


def test_a_cursor_the_api_handed_out_still_works(world: World) -> None:
    client = client_for(world)
    first = client.get("/api/v1/tools", {"limit": 1}).json()
    second = client.get(first["next"])
    assert second.status_code == 200 and second.json()["results"][0]["name"] != first["results"][0]["name"]


@pytest.mark.parametrize("url", ["/api/v1/audit/tool-calls", "/api/v1/audit/changes"])
def test_an_impossible_date_on_audit_filters_is_a_400_naming_the_parameter(world: World, url: str) -> None:
    client = client_for(world)
    for param in ("since", "until"):
        for value in ("2020-13-45", "2020-02-30", "2020-01-01T25:61:00", "2020-01-01T10:00:00+99:00", "0001-01-01T00:00:00+05:00"):
            response = client.get(url, {param: value})
            assert response.status_code == 400, (param, value, response.content)
            assert param in response.json()


def test_good_dates_on_audit_filters_still_filter(world: World) -> None:
    client = client_for(world)
    assert len(client.get("/api/v1/audit/changes", {"until": "9999-12-31", "since": "2000-01-01"}).json()["results"]) > 0
    assert client.get("/api/v1/audit/changes", {"until": "2000-01-01"}).json()["results"] == []
    assert client.get("/api/v1/audit/changes", {"since": "2000-01-01T00:00:00Z"}).status_code == 200


# --------------------------------------------------------------------------- bodies of the wrong shape


@pytest.mark.parametrize("body", ["[null,null]", "null", '"text"', "42", "[]"])
def test_plugin_install_patch_with_a_non_object_body_is_a_400(world: World, body: str) -> None:
    client = client_for(world)
    created = client.post("/api/v1/plugin-installs", {"plugin": "order-desk"}, format="json")
    assert created.status_code == 201, created.content
    install = PluginInstall.objects.get(pk=created.json()["id"])
    response = post_raw(client, f"/api/v1/plugin-installs/{install.pk}", body, method="patch")
    assert response.status_code == 400, response.content
    upgrade = post_raw(client, f"/api/v1/plugin-installs/{install.pk}/upgrade", body)
    assert upgrade.status_code == 400, upgrade.content


@pytest.mark.parametrize("url", ["/api/v1/runs", "/api/v1/tools", "/api/v1/plugin-installs", "/api/v1/agents"])
def test_a_list_where_an_object_is_expected_is_a_400(world: World, url: str) -> None:
    response = post_raw(client_for(world), url, "[null,null]")
    assert response.status_code == 400, response.content


def test_nul_characters_in_a_json_body_are_a_400(world: World) -> None:
    body = '{"agent": "order-assistant", "input": "hi", "facts": {"note": "a\\u0000b"}}'
    response = post_raw(client_for(world), "/api/v1/runs", body)
    assert response.status_code == 400, response.content
    assert "NUL" in response.json()["detail"]
    assert not Run.objects.exists()


# --------------------------------------------------------------------------- facts


@pytest.mark.parametrize("facts", [
    {"": "x"},
    {" ": "x"},
    {"a b": "x"},
    {"x" * 65: 1},
    {f"k{i}": i for i in range(51)},
    {"big": "x" * 20_000},
    {"messages": "hijack"},
])
def test_bad_facts_are_refused_at_the_request(world: World, facts: dict[str, Any]) -> None:
    response = client_for(world).post("/api/v1/runs", {"agent": "order-assistant", "input": "hi", "facts": facts}, format="json")
    assert response.status_code == 400, response.content
    assert "facts" in response.json()
    assert not Run.objects.exists()


def test_good_facts_are_accepted(world: World) -> None:
    facts = {"user_tier": "gold", "flight_no": "CA1234", "order.count": 3, "nested": {"a": [1, 2]}}
    response = client_for(world).post("/api/v1/runs", {"agent": "order-assistant", "input": "hi", "facts": facts}, format="json")
    assert response.status_code == 202, response.content
