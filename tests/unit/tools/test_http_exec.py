from __future__ import annotations

import json
import logging

import pytest

from egress.guard import EgressDenied
from tools.http_exec import (
    HttpToolError,
    HttpToolSpec,
    SecretUnavailable,
    ToolTimeout,
    execute_http_tool,
    render_request,
)

SECRETS = {"ORDER_API_TOKEN": "tok-SUPERSECRET-123456", "PARTNER_KEY": "pk-ANOTHERSECRET-987"}
ALLOW = ["127.0.0.1/32"]


def resolve_secret(name: str) -> str | None:
    return SECRETS.get(name)


@pytest.mark.parametrize(
    ("value", "expected_path"),
    [
        ("O202411280001", "/orders/O202411280001/items"),
        ("../admin", "/orders/..%2Fadmin/items"),
        ("a/b?x=1#frag", "/orders/a%2Fb%3Fx%3D1%23frag/items"),
        ("..", "/orders/%2E%2E/items"),
        ("订单 1", "/orders/%E8%AE%A2%E5%8D%95%201/items"),
    ],
)
def test_path_parameters_are_url_encoded(local_server, value: str, expected_path: str) -> None:
    spec = HttpToolSpec(method="GET", url_template=f"{local_server.base}/orders/{{order_id}}/items", body="none")
    result = execute_http_tool(
        spec, {"order_id": value}, idempotency_key=None, resolve_secret=resolve_secret, allow=ALLOW
    )
    assert result.ok and result.status_code == 200
    assert result.body["path"] == expected_path


def test_query_and_json_body_mapping_and_idempotency_key(local_server) -> None:
    spec = HttpToolSpec(
        method="POST",
        url_template=f"{local_server.base}/orders/{{order_id}}/refunds",
        query_params=["lang", "tags"],
        body="json",
        headers={
            "Authorization": "Bearer {secret:ORDER_API_TOKEN}",
            "X-Partner": "secret:PARTNER_KEY",
            "X-Plain": "v1",
        },
        timeout=5,
    )
    args = {
        "order_id": "O1",
        "lang": "zh-CN",
        "tags": ["a", "b c"],
        "amount": 12.5,
        "reason": "damaged",
        "notify": True,
    }
    result = execute_http_tool(spec, args, idempotency_key="run1:3:call_9", resolve_secret=resolve_secret, allow=ALLOW)
    assert result.ok and result.status_code == 200
    echo = result.body
    assert echo["method"] == "POST"
    assert echo["path"] == "/orders/O1/refunds?lang=zh-CN&tags=a&tags=b+c"
    assert json.loads(echo["body"]) == {"amount": 12.5, "reason": "damaged", "notify": True}
    headers = echo["headers"]
    assert headers["idempotency-key"] == "run1:3:call_9"
    assert headers["authorization"] == "Bearer tok-SUPERSECRET-123456"
    assert headers["x-partner"] == "pk-ANOTHERSECRET-987"
    assert headers["x-plain"] == "v1"
    assert headers["content-type"] == "application/json"
    assert result.latency_ms >= 0
    preview = result.request_preview
    assert preview["method"] == "POST"
    assert preview["url"] == f"{local_server.base}/orders/O1/refunds?lang=zh-CN&tags=a&tags=b+c"
    assert preview["headers"] == {
        "Authorization": "Bearer ******",
        "X-Partner": "******",
        "X-Plain": "v1",
        "Idempotency-Key": "run1:3:call_9",
    }
    assert "SUPERSECRET" not in json.dumps(preview) and "ANOTHERSECRET" not in json.dumps(preview)


def test_secrets_never_reach_logs_or_errors(local_server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    spec = HttpToolSpec(
        method="GET",
        url_template=f"{local_server.base}/status/{{code}}",
        headers={"Authorization": "Bearer {secret:ORDER_API_TOKEN}"},
        body="none",
        timeout=5,
    )
    result = execute_http_tool(spec, {"code": 404}, idempotency_key="k1", resolve_secret=resolve_secret, allow=ALLOW)
    assert not result.ok and result.status_code == 404
    assert result.error.startswith("HTTP 404 Not Found: order not found")
    ok = execute_http_tool(
        HttpToolSpec("GET", f"{local_server.base}/echo", headers={"Authorization": "Bearer {secret:ORDER_API_TOKEN}"}),
        {},
        idempotency_key=None,
        resolve_secret=resolve_secret,
        allow=ALLOW,
    )
    assert ok.body["headers"]["authorization"] == "Bearer tok-SUPERSECRET-123456"
    slow = HttpToolSpec("GET", f"{local_server.base}/slow", headers={"X-Key": "secret:PARTNER_KEY"}, timeout=0.3)
    with pytest.raises(ToolTimeout) as info:
        execute_http_tool(slow, {}, idempotency_key=None, resolve_secret=resolve_secret, allow=ALLOW)
    assert caplog.records, "expected some log records (httpx/httpcore debug) to check"
    everything = "\n".join(
        [r.getMessage() for r in caplog.records] + [repr(r.args) for r in caplog.records] + [str(info.value)]
    )
    assert "SUPERSECRET" not in everything and "ANOTHERSECRET" not in everything
    assert "SUPERSECRET" not in repr(result) and "SUPERSECRET" not in str(result.error)


def test_timeout_message(local_server) -> None:
    spec = HttpToolSpec("GET", f"{local_server.base}/slow", timeout=0.3)
    with pytest.raises(ToolTimeout, match="no result was obtained"):
        execute_http_tool(spec, {}, idempotency_key=None, resolve_secret=resolve_secret, allow=ALLOW)


def test_text_body_and_status(local_server) -> None:
    result = execute_http_tool(
        HttpToolSpec("GET", f"{local_server.base}/text", body="none"),
        {},
        idempotency_key=None,
        resolve_secret=resolve_secret,
        allow=ALLOW,
    )
    assert result.ok and result.body == "hello 世界"


def test_egress_guard_applies(local_server, connect_guard: list) -> None:
    spec = HttpToolSpec("GET", f"{local_server.base}/echo", body="none")
    with pytest.raises(EgressDenied, match="loopback"):
        execute_http_tool(spec, {}, idempotency_key=None, resolve_secret=resolve_secret, allow=())
    redirect = HttpToolSpec("GET", f"{local_server.base}/redirect-metadata", body="none")
    with pytest.raises(EgressDenied, match=r"169\.254\.169\.254"):
        execute_http_tool(redirect, {}, idempotency_key=None, resolve_secret=resolve_secret, allow=ALLOW)
    assert all(host == "127.0.0.1" for host, _ in connect_guard)


def test_secret_header_dropped_on_cross_origin_redirect() -> None:
    import httpx

    from egress.guard import guarded_client

    seen: list[httpx.Request] = []

    class Fake(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request)
            if len(seen) == 1:
                return httpx.Response(307, headers={"Location": "https://other.example.com/next"})
            return httpx.Response(200, json={"ok": True})

    client = guarded_client(resolver=lambda host, port: ["93.184.216.34"], sensitive_headers={"x-partner"})
    client.guard._pool_for = lambda key: Fake()  # type: ignore[method-assign]
    with client:
        response = client.post(
            "https://api.example.com/start",
            headers={"Authorization": "Bearer s", "X-Partner": "p", "X-Other": "o"},
            json={"a": 1},
        )
    assert response.status_code == 200
    first, second = seen
    assert first.headers["authorization"] == "Bearer s" and first.headers["x-partner"] == "p"
    assert "authorization" not in second.headers and "x-partner" not in second.headers
    assert second.headers["x-other"] == "o" and second.headers["host"] == "other.example.com"
    assert second.method == "POST" and json.loads(second.read()) == {"a": 1}  # 307 keeps method and body


def test_missing_secret_and_bad_specs(local_server) -> None:
    spec = HttpToolSpec("GET", f"{local_server.base}/echo", headers={"Authorization": "secret:NOPE"})
    with pytest.raises(SecretUnavailable, match="'NOPE'"):
        execute_http_tool(spec, {}, idempotency_key=None, resolve_secret=resolve_secret, allow=ALLOW)
    with pytest.raises(ValueError, match="not in the host"):
        HttpToolSpec("GET", "https://{tenant}.example.com/x")
    with pytest.raises(ValueError, match="absolute http"):
        HttpToolSpec("GET", "file:///etc/passwd")
    with pytest.raises(HttpToolError, match="missing value for URL parameter 'order_id'"):
        render_request(HttpToolSpec("GET", "https://api.example.com/o/{order_id}"), {})


def test_preview_without_resolving_secrets() -> None:
    spec = HttpToolSpec(
        "POST",
        "https://api.example.com/o/{order_id}",
        headers={"Authorization": "secret:ORDER_API_TOKEN", "X-Api-Key": "literal-key-value"},
    )
    rendered = render_request(
        spec, {"order_id": "O1", "card_number": "4111111111111111", "phone": "13812345678"}, idempotency_key="k"
    )
    assert rendered.preview["headers"] == {"Authorization": "******", "X-Api-Key": "******", "Idempotency-Key": "k"}
    assert rendered.preview["body"] == {"card_number": "************1111", "phone": "138****5678"}
    assert "Authorization" not in rendered.headers  # unresolved without a resolver
    assert "literal-key-value" not in repr(rendered)


def test_a_sensitive_field_in_the_url_is_masked_in_the_preview_only() -> None:
    spec = HttpToolSpec("POST", "https://api.example.com/customers/{customer_id}/refunds/{order_id}?note={reason}",
                        query_params=["account"])
    arguments = {"customer_id": "C77", "order_id": "O1", "reason": "broken cup", "account": "ACC-9"}
    rendered = render_request(spec, arguments, sensitive_fields=["customer_id", "reason", "account"])
    assert rendered.preview["url"] == "https://api.example.com/customers/******/refunds/O1?note=******&account=%2A%2A%2A%2A%2A%2A"
    assert rendered.url == "https://api.example.com/customers/C77/refunds/O1?note=broken%20cup&account=ACC-9"
    assert render_request(spec, arguments).preview["url"] == rendered.url, "nothing declared: nothing masked"
