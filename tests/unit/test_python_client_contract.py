"""The Python client (clients/python) against the API's OpenAPI schema, as ``manage.py spectacular`` writes it.

Every public call of the client is made against a recording transport; each request it sends must be an operation in
the schema (path and method), with only the query parameters, headers and JSON body fields the schema declares for it.
A renamed path, a removed field or parameter in the API breaks this test; so does a client call this test does not make.
"""

from __future__ import annotations

import copy
import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agentops_client import Client
from django.core.management import call_command

RUN = {"id": "5b0c6f1e-0000-4000-8000-000000000001", "status": "queued", "agent": "order-assistant", "input": "hi",
       "output": None, "error": None, "session": "5b0c6f1e-0000-4000-8000-000000000002", "version": 1, "terminal_reason": None,
       "step": 0, "last_seq": 0, "created_at": "2026-01-01T00:00:00Z", "finished_at": None}
APPROVAL = {"id": "5b0c6f1e-0000-4000-8000-000000000003", "status": "approved", "tool_name": "refund_order", "agent": "a",
            "run": RUN["id"], "step": 1, "call_id": "c", "question": "q", "preview": {}, "arguments_hash": "h",
            "required_approvals": 1, "requested_at": "x", "expires_at": None, "decided_at": None, "decisions": []}
FINISHED = b'id: 9\ndata: {"seq": 9, "type": "run.finished", "payload": {"output": "done"}}\n\n'
#: Headers every request carries that are the transport's, not an API operation's parameters.
TRANSPORT_HEADERS = {"host", "accept", "accept-encoding", "connection", "user-agent", "authorization", "content-type",
                     "content-length"}


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = Path(tmp_path_factory.mktemp("schema")) / "openapi.json"
    call_command("spectacular", "--format", "openapi-json", "--file", str(path))
    return dict(json.loads(path.read_text()))


def _respond(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if "text/event-stream" in request.headers.get("accept", ""):
        return httpx.Response(202 if request.method == "POST" else 200, content=FINISHED,
                              headers={"content-type": "text/event-stream", "X-Run-Id": RUN["id"]})
    if path.endswith(("/sessions", "/approvals")):
        return httpx.Response(200, json={"next": None, "previous": None, "results": []})
    if "/approvals/" in path:
        return httpx.Response(200, json=APPROVAL)
    return httpx.Response(202 if request.method == "POST" else 200, json=RUN)


def _every_call(client: Client) -> Iterator[str]:
    """Each public method of the client, called with every optional argument it has; yields its name."""
    client.create_run("order-assistant", "hi", session=RUN["session"], facts={"order_id": "O1"}, idempotency_key="k-1")
    yield "create_run"
    client.create_flow_run("refund-desk", {"order_id": "O1", "amount": "30.00"}, facts={"tier": "gold"}, idempotency_key="k-2")
    yield "create_flow_run"
    client.get_run(RUN["id"])
    yield "get_run"
    list(client.stream_run(RUN["id"], after=3))
    yield "stream_run"
    list(client.create_and_stream("order-assistant", "hi", session=RUN["session"], facts={"order_id": "O1"}))
    yield "create_and_stream"
    client.list_sessions(agent="order-assistant", erased=False, limit=10, cursor="abc")
    yield "list_sessions"
    client.list_approvals(status="pending", limit=10, cursor="abc")
    yield "list_approvals"
    client.get_approval(APPROVAL["id"])
    yield "get_approval"
    client.approve(APPROVAL["id"], note="ok", arguments={"amount": "30.00"}, arguments_hash="0" * 64)
    yield "approve"
    client.reject(APPROVAL["id"], note="no")
    yield "reject"


def _sent_requests() -> tuple[list[httpx.Request], set[str]]:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return _respond(request)

    with Client("http://api.test", "aok_0123abcd_secret", transport=httpx.MockTransport(handler),
                sleep=lambda _: None) as client:
        called = set(_every_call(client))
    return sent, called


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _shapes(schema: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    node = _resolve(schema, node)
    if "oneOf" in node or "anyOf" in node:
        return [shape for option in node.get("oneOf", node.get("anyOf")) for shape in _shapes(schema, option)]
    return [node]


def _operation(schema: dict[str, Any], method: str, path: str) -> tuple[str, dict[str, Any]] | None:
    for template, item in schema["paths"].items():
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path) and method.lower() in item:
            return template, item[method.lower()]
    return None


def violations(schema: dict[str, Any], requests: list[httpx.Request]) -> list[str]:
    """What each request sends that the schema does not declare (empty when the client matches the API)."""
    problems: list[str] = []
    for request in requests:
        where = f"{request.method} {request.url.path}"
        found = _operation(schema, request.method, request.url.path)
        if found is None:
            problems.append(f"{where}: no such operation in the schema")
            continue
        template, operation = found
        declared = {(p["in"], p["name"].lower()) for p in operation.get("parameters", [])}
        for name in request.url.params:
            if ("query", name.lower()) not in declared:
                problems.append(f"{where}: query parameter {name!r} is not in the schema of {template}")
        for name in request.headers:
            if name.lower() not in TRANSPORT_HEADERS and ("header", name.lower()) not in declared:
                problems.append(f"{where}: header {name!r} is not in the schema of {template}")
        if request.content:
            content = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if content is None:
                problems.append(f"{where}: sends a JSON body, the schema of {template} takes none")
                continue
            fields = list(json.loads(request.content))
            # a body of one of several shapes (oneOf: an agent's run or a flow's): judged by the shape it fits best
            shapes = [set(shape.get("properties", {})) for shape in _shapes(schema, content["schema"])]
            best = max(shapes, key=lambda names: sum(field in names for field in fields))
            for field in fields:
                if field not in best:
                    problems.append(f"{where}: body field {field!r} is not in the schema of {template}")
    return problems


def test_every_request_the_client_sends_is_an_operation_of_the_schema_with_its_declared_fields(schema: dict[str, Any]) -> None:
    sent, called = _sent_requests()
    # every public method of the client was exercised (a new one must be added above, and so checked)
    public = {name for name, _ in inspect.getmembers(Client, inspect.isfunction) if not name.startswith("_")} - {"close"}
    assert called == public
    # and each of the requests it sent matches the schema
    assert violations(schema, sent) == []
    # (the calls above cover every field and parameter the client can send)
    bodies = {key for r in sent if r.content for key in json.loads(r.content)}
    assert bodies == {"agent", "flow", "input", "session", "facts", "stream", "note", "arguments", "arguments_hash"}
    assert {"idempotency-key", "last-event-id"} <= {name.lower() for r in sent for name in r.headers}


def test_the_check_fails_when_the_api_changes(schema: dict[str, Any]) -> None:
    sent, _ = _sent_requests()
    # a body field dropped from the create serializer
    changed = copy.deepcopy(schema)
    create = changed["paths"]["/api/v1/runs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    for shape in _shapes(changed, create):
        shape["properties"].pop("stream", None)
    assert any("body field 'stream'" in p for p in violations(changed, sent))
    # a header parameter no longer declared
    changed = copy.deepcopy(schema)
    stream = changed["paths"]["/api/v1/runs/{id}/stream"]["get"]
    stream["parameters"] = [p for p in stream["parameters"] if p["name"] != "Last-Event-ID"]
    assert any("header 'last-event-id'" in p for p in violations(changed, sent))
    # an operation removed
    changed = copy.deepcopy(schema)
    del changed["paths"]["/api/v1/approvals/{id}/approve"]
    assert any(p.startswith("POST /api/v1/approvals/") and "no such operation" in p for p in violations(changed, sent))
