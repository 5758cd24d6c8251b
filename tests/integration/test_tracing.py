"""OpenTelemetry on the live stack: a run started over the API reaches an OTLP/HTTP receiver as one trace.

The receiver is a stdlib HTTP server in the test process that decodes ``POST /v1/traces`` bodies
(``ExportTraceServiceRequest`` protobufs). The stack is a dedicated one, started with
``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at it; in production mode the spans come from the separate
Celery worker process, in embedded mode from the server's in-process worker.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.factories import World, make_world
from tests.support.live_stack import LiveStack, make_live_stack

pytestmark = pytest.mark.integration


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    service: str
    attributes: dict[str, Any]


@dataclass
class OtlpReceiver:
    server: ThreadingHTTPServer
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def wait_for(self, trace_id: str, names: set[str], timeout: float = 20) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                spans = [s for s in self.spans if s.trace_id == trace_id]
            if names <= {s.name for s in spans}:
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"spans {sorted(names)} did not all arrive in {timeout}s; got {sorted(s.name for s in spans)}")
            time.sleep(0.1)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _handler(receiver_spans: list[ReceivedSpan], lock: threading.Lock) -> type[BaseHTTPRequestHandler]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            request = ExportTraceServiceRequest.FromString(body)
            received = []
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        received.append(ReceivedSpan(
                            name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(), service=str(resource.get("service.name")),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        ))
            with lock:
                receiver_spans.extend(received)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    spans: list[ReceivedSpan] = []
    lock = threading.Lock()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(spans, lock))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield OtlpReceiver(server, spans, lock)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def traced_stack(receiver: OtlpReceiver, django_db_setup: Any) -> Iterator[LiveStack]:
    stack = make_live_stack({
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "agentops-tracing-test",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    })
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def world(traced_stack: LiveStack, django_db_blocker: Any) -> World:
    with django_db_blocker.unblock():
        return make_world()


def test_a_run_started_over_the_api_is_exported_as_one_trace_of_genai_spans(
    traced_stack: LiveStack, receiver: OtlpReceiver, world: World
) -> None:
    # given a stack exporting to the receiver; when a client starts a run about an order's shipment
    with traced_stack.client(world.raw_key) as http:
        response = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": "where is order O202411280001?"})
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    run = traced_stack.wait_for_run(world.raw_key, run_id)
    assert run["terminal_reason"] == "final_answer", run
    # then its spans arrive, all in the trace whose id is the run's
    trace_id = run_id.replace("-", "")
    expected = {"invoke_agent order-assistant", "chat demo/planner", "execute_tool query_logistics"}
    spans = receiver.wait_for(trace_id, expected)
    root = next(s for s in spans if s.name == "invoke_agent order-assistant")
    # and the model and tool calls are children of the run's span, which is the trace's root
    assert root.parent_span_id == ""
    children = [s for s in spans if s is not root]
    assert children and all(s.parent_span_id == root.span_id for s in children), [(s.name, s.parent_span_id) for s in spans]
    assert {s.service for s in spans} == {"agentops-tracing-test"}
    assert root.attributes["agentops.run.id"] == run_id
    assert root.attributes["agentops.run.terminal_reason"] == "final_answer"
    assert root.attributes["gen_ai.usage.input_tokens"] == run["usage"]["input_tokens"]
    chat = next(s for s in spans if s.name == "chat demo/planner")
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.usage.input_tokens"] > 0
    tool = next(s for s in spans if s.name == "execute_tool query_logistics")
    assert tool.attributes["gen_ai.tool.name"] == "query_logistics"
    assert tool.attributes["agentops.tool.status"] == "ok"
