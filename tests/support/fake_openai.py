"""A local OpenAI-compatible server for tests: real HTTP, real protocol, scripted behaviour.

In-process::

    server = FakeOpenAI(api_key="sk-test", models=["gpt-4o-mini"]).start()
    server.script(text("hello"), tool_calls(call("query_order", {"order_id": "O202411280001"})))
    ...  # point the openai SDK at server.base_url
    server.chat_requests[0]["body"]["messages"]
    server.stop()

From another process (e.g. a Celery worker started by an integration test), script it over HTTP::

    POST {base_url}/_script   {"behaviours": [{"kind": "text", "content": "hi"}], "replace": true}
    POST {base_url}/_default  {"kind": "planner"}            # the behaviour when the queue is empty
    GET  {base_url}/_requests                                # every recorded request
    POST {base_url}/_reset                                   # clear queue, records, default

Run standalone: ``python -m tests.support.fake_openai --port 8765 [--api-key K] [--default planner]``.

Behaviours are JSON dicts (``kind`` plus options); the helpers below build them:
``text``, ``tool_calls``/``call``, ``rate_limited``, ``server_error``, ``error``, ``hang``,
``no_choices``, ``not_json``. Any behaviour may add ``"delay": seconds`` (answer late),
``"usage": {"prompt_tokens": n, "completion_tokens": m}`` (exact usage) or ``"usage": null``
(send no usage). A streamed reply is sent in ``"pieces"`` content chunks (default 3), ``"chunk_delay"``
seconds apart (default 0): a slow stream. ``{"kind": "planner"}`` answers like the deterministic planner would.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from runtime.tokens import count_messages, count_tokens, count_tools

Behaviour = dict[str, Any]
DefaultBehaviour = Behaviour | Callable[[dict[str, Any]], Behaviour]

# -- behaviour builders -------------------------------------------------------------------------


def text(content: str = "OK", **options: Any) -> Behaviour:
    return {"kind": "text", "content": content, **options}


def call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """One tool call; a ``str`` ``arguments`` is sent verbatim (use it for malformed JSON)."""
    item: dict[str, Any] = {"name": name, "arguments": arguments}
    if call_id:
        item["id"] = call_id
    return item


def tool_calls(*calls: dict[str, Any], content: str | None = None, **options: Any) -> Behaviour:
    return {"kind": "tool_calls", "calls": list(calls), "content": content, **options}


def error(status: int, message: str = "", headers: dict[str, str] | None = None, **options: Any) -> Behaviour:
    return {"kind": "error", "status": status, "message": message, "headers": headers or {}, **options}


def rate_limited(retry_after: float | None = 1, **options: Any) -> Behaviour:
    headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
    return error(429, "Rate limit reached for requests", headers, **options)


def server_error(status: int = 500, message: str = "The server had an error while processing your request.", **options: Any) -> Behaviour:
    return error(status, message, **options)


def hang(seconds: float, then: Behaviour | None = None) -> Behaviour:
    """Sleep ``seconds`` before answering (``then``, or a text reply). Interrupted by ``stop()``."""
    return {"kind": "hang", "seconds": seconds, "then": then or text("late answer")}


def no_choices(**options: Any) -> Behaviour:
    return {"kind": "no_choices", **options}


def not_json(**options: Any) -> Behaviour:
    return {"kind": "not_json", **options}


# -- the server ---------------------------------------------------------------------------------


class FakeOpenAI:
    """A threaded HTTP server on 127.0.0.1 speaking enough of the OpenAI API for the SDK."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        models: list[str] | None = None,
        default: DefaultBehaviour | None = None,
        port: int = 0,
    ) -> None:
        self.api_key = api_key
        self.models = list(models) if models is not None else None
        self.default: DefaultBehaviour = default if default is not None else text("OK")
        self._queue: deque[Behaviour] = deque()
        self._records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle
    def start(self) -> FakeOpenAI:
        handler = type("Handler", (_Handler,), {"fake": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        httpd.daemon_threads = True
        httpd.block_on_close = False
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "the fake server is not started"
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # scripting
    def script(self, *behaviours: Behaviour, replace: bool = False) -> None:
        with self._lock:
            if replace:
                self._queue.clear()
            self._queue.extend(behaviours)

    def set_default(self, default: DefaultBehaviour) -> None:
        self.default = default

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self._records.clear()
            self.default = text("OK")

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._records)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].endswith("/chat/completions")]

    def _record(self, method: str, path: str, headers: dict[str, str], body: Any) -> None:
        with self._lock:
            self._records.append({"method": method, "path": path, "headers": headers, "body": body, "at": time.time()})

    def _next(self, body: dict[str, Any]) -> Behaviour:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        default = self.default
        return default(body) if callable(default) else dict(default)

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAI
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes; don't wait 40 ms for an ACK

    def log_message(self, format: str, *args: Any) -> None:  # silence the default stderr logging
        return

    # routing
    def do_GET(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = self.path.split("?", 1)[0]
        if path.endswith("/_requests"):
            self._json(200, {"requests": self.fake.requests, "pending": self.fake.pending})
            return
        self.fake._record("GET", path, headers, None)
        if path.endswith("/models"):
            if not self._authorised(headers):
                return
            names = self.fake.models if self.fake.models is not None else ["fake-model"]
            data = [{"id": n, "object": "model", "created": 0, "owned_by": "fake"} for n in names]
            self._json(200, {"object": "list", "data": data})
            return
        self._json(404, {"error": {"message": f"no route for GET {path}", "type": "invalid_request_error"}})

    def do_POST(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._json(400, {"error": {"message": "the request body is not JSON", "type": "invalid_request_error"}})
            return
        if path.endswith("/_script"):
            items = body.get("behaviours", body) if isinstance(body, dict) else body
            self.fake.script(*items, replace=bool(isinstance(body, dict) and body.get("replace")))
            self._json(200, {"pending": self.fake.pending})
            return
        if path.endswith("/_default"):
            self.fake.set_default(body)
            self._json(200, {"default": body})
            return
        if path.endswith("/_reset"):
            self.fake.reset()
            self._json(200, {"reset": True})
            return
        self.fake._record("POST", path, headers, body)
        if not path.endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"no route for POST {path}", "type": "invalid_request_error"}})
            return
        if not self._authorised(headers):
            return
        model = str(body.get("model", ""))
        if self.fake.models is not None and model not in self.fake.models:
            message = f"The model `{model}` does not exist or you do not have access to it."
            self._json(404, {"error": {"message": message, "type": "invalid_request_error", "code": "model_not_found"}})
            return
        try:
            self._behave(self.fake._next(body), body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. its timeout)
            return

    def _authorised(self, headers: dict[str, str]) -> bool:
        expected = self.fake.api_key
        if expected is None:
            return True
        given = headers.get("authorization", "").removeprefix("Bearer ").strip()
        if given == expected:
            return True
        shown = f"{given[:3]}***{given[-4:]}" if len(given) > 8 else "***"
        message = f"Incorrect API key provided: {shown}. You can find your API key at https://example.invalid."
        self._json(401, {"error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}})
        return False

    # behaviours
    def _behave(self, behaviour: Behaviour, body: dict[str, Any]) -> None:
        kind = behaviour.get("kind", "text")
        if behaviour.get("delay"):
            self.fake._sleep(float(behaviour["delay"]))
        if kind == "hang":
            self.fake._sleep(float(behaviour.get("seconds", 30)))
            if self.fake._stopping.is_set():
                return
            self._behave(dict(behaviour.get("then") or text("late answer")), body)
            return
        if kind == "planner":
            behaviour = {**_planner_behaviour(body), **{k: v for k, v in behaviour.items() if k != "kind"}}
            kind = behaviour["kind"]
        if kind == "error":
            status = int(behaviour.get("status", 500))
            message = behaviour.get("message") or f"error {status}"
            payload = {"error": {"message": message, "type": "server_error" if status >= 500 else "requests"}}
            self._json(status, payload, dict(behaviour.get("headers") or {}))
            return
        if kind == "not_json":
            self._send(200, b"<html>this is not json</html>", "text/html")
            return
        content, calls = _reply_parts(behaviour)
        usage = _usage(behaviour, body, content, calls)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(body, behaviour, content, calls, usage if include_usage else None)
            return
        self._json(200, _completion(body, behaviour, content, calls, usage))

    def _stream(
        self,
        body: dict[str, Any],
        behaviour: Behaviour,
        content: str | None,
        calls: list[dict[str, Any]],
        usage: dict[str, int] | None,
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
        }
        base["model"] = body.get("model", "")

        def emit(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> None:
            chunk = {**base, "choices": choices, **(extra or {})}
            self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())

        emit([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        if behaviour.get("kind") != "no_choices":
            pause = float(behaviour.get("chunk_delay") or 0)
            for piece in _pieces(content or "", int(behaviour.get("pieces") or 3)):
                emit([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
                if pause:
                    self.fake._sleep(pause)
            for index, item in enumerate(calls):
                head = {"index": index, "id": item["id"], "type": "function"}
                head["function"] = {"name": item["function"]["name"], "arguments": ""}
                emit([{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}])
                for piece in _pieces(item["function"]["arguments"], 3):
                    part = {"index": index, "function": {"arguments": piece}}
                    emit([{"index": 0, "delta": {"tool_calls": [part]}, "finish_reason": None}])
            finish = "tool_calls" if calls else "stop"
            emit([{"index": 0, "delta": {}, "finish_reason": finish}])
        if usage is not None:
            emit([], {"usage": usage})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    # wire helpers
    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload, ensure_ascii=False).encode(), "application/json", headers)

    def _send(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def _reply_parts(behaviour: Behaviour) -> tuple[str | None, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []
    for index, item in enumerate(behaviour.get("calls") or []):
        arguments = item.get("arguments", {})
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        calls.append(
            {
                "id": item.get("id") or f"call_fake_{index}",
                "type": "function",
                "function": {"name": item["name"], "arguments": raw},
            }
        )
    content = behaviour.get("content")
    if behaviour.get("kind", "text") == "text" and content is None:
        content = "OK"
    return content, calls


def _usage(behaviour: Behaviour, body: dict[str, Any], content: str | None, calls: list[dict[str, Any]]) -> dict[str, int] | None:
    if "usage" in behaviour:
        given = behaviour["usage"]
        if given is None:
            return None
        prompt, completion = int(given.get("prompt_tokens", 0)), int(given.get("completion_tokens", 0))
    else:
        prompt = count_messages(body.get("messages") or []) + count_tools(body.get("tools") or [])
        completion = count_tokens(content or "") + sum(count_tokens(c["function"]["name"] + c["function"]["arguments"]) for c in calls)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _completion(
    body: dict[str, Any],
    behaviour: Behaviour,
    content: str | None,
    calls: list[dict[str, Any]],
    usage: dict[str, int] | None,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", ""),
        "choices": [],
    }
    if behaviour.get("kind") != "no_choices":
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        payload["choices"] = [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}]
    if usage is not None:
        payload["usage"] = usage
    return payload


def _pieces(text_: str, count: int) -> list[str]:
    if not text_:
        return []
    size = max(1, -(-len(text_) // count))
    return [text_[i : i + size] for i in range(0, len(text_), size)]


def _planner_behaviour(body: dict[str, Any]) -> Behaviour:
    """Answer the way the deterministic planner would, given the request's messages and tools."""
    from llm.planner import DeterministicPlanner
    from runtime.types import ModelRequest, ToolSpec

    tools = [
        ToolSpec(t["function"]["name"], t["function"].get("description", ""), t["function"].get("parameters") or {})
        for t in body.get("tools") or []
        if t.get("type") == "function"
    ]
    response = DeterministicPlanner().complete(ModelRequest(model="fake/planner", messages=body.get("messages") or [], tools=tools))
    if response.tool_calls:
        return tool_calls(*[call(c.name, c.arguments, c.id) for c in response.tool_calls], content=response.content)
    return text(response.content or "")


def main() -> None:  # pragma: no cover - a manual entry point
    parser = argparse.ArgumentParser(description="Run the fake OpenAI-compatible server.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--default", default="text", choices=["text", "planner"])
    args = parser.parse_args()
    default: Behaviour = {"kind": "planner"} if args.default == "planner" else text("OK")
    server = FakeOpenAI(api_key=args.api_key, default=default, port=args.port).start()
    print(server.base_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
