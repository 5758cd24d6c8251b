"""The typed Python client (clients/python/agentops_client) against the live stack, in both run modes.

Real server (uvicorn), real worker, the model a local OpenAI-compatible server streaming slowly; the client talks HTTP
to the server, once through a TCP proxy that cuts the connection mid-stream (a dropped connection, not a mock).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from agentops_client import Client, NotFound, RateLimited, RetryNotice, StreamEvent

from accounts import services as tenant_services
from agents.models import Run, RunEvent
from approvals.models import ApprovalRequest
from tenants.models import Role
from tests.factories import make_user, make_world
from tests.support.fake_openai import FakeOpenAI, call, text, tool_calls
from tests.support.live_stack import LiveStack
from tests.support.refund_target import add_refund_tool, serve_refund_target
from tests.support.stream_stack import WORDS, openai_world

pytestmark = pytest.mark.integration

#: Creates per key per second: small enough to reach a real 429 (with Retry-After) in a test, per key so no other test
#: here meets it.
CREATE_RATE = 2
STREAM_STACK_ENV = {"RUN_CREATE_THROTTLE_RATE": f"{CREATE_RATE}/s"}


def _committed(django_db_blocker: Any, run_id: str) -> list[int]:
    with django_db_blocker.unblock():
        return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))


class CuttingProxy:
    """A TCP proxy to the stack that closes the first event stream it carries after ``cut_after`` SSE ids went through."""

    def __init__(self, upstream: str, cut_after: int) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.cut_after = cut_after
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(downstream,), daemon=True).start()

    def _serve(self, downstream: socket.socket) -> None:
        upstream = socket.create_connection(self.upstream)
        state = {"stream": False}

        def requests() -> None:
            while data := _recv(downstream):
                if b"text/event-stream" in data:
                    state["stream"] = True
                upstream.sendall(data)
            upstream.close()

        threading.Thread(target=requests, daemon=True).start()
        seen = b""
        while data := _recv(upstream):
            downstream.sendall(data)
            seen += data
            if state["stream"] and self.cuts == 0 and seen.count(b"\nid: ") + seen.startswith(b"id: ") >= self.cut_after:
                self.cuts += 1
                break
        for sock in (downstream, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def test_create_and_stream_to_the_end_with_deltas_and_every_committed_event(stack: LiveStack, fake: FakeOpenAI,
                                                                          django_db_blocker: Any) -> None:
    world = openai_world(django_db_blocker)
    # given a model that streams its answer slowly
    fake.script(text(WORDS, pieces=30, chunk_delay=0.03, delay=0.5), replace=True)  # late: this client creates, then joins
    with Client(stack.base_url, world.raw_key) as client:
        # when a run is created, then streamed to its end
        run = client.create_run("order-assistant", "where is order O202411280001?")
        assert run.status in ("queued", "running") and run.agent == "order-assistant"
        events = list(client.stream_run(run.id))
        # then the deltas spell the answer, every committed event came once in order, and the last is run.finished
        deltas = [e for e in events if e.is_delta]
        assert deltas and "".join(e.text for e in deltas) == WORDS
        assert [e.seq for e in events if e.seq is not None] == _committed(django_db_blocker, run.id)
        assert events[-1].type == "run.finished" and events[-1].data["payload"]["output"] == WORDS
        finished = client.get_run(run.id)
        assert finished.done and finished.output == WORDS and finished.last_seq == events[-1].seq
        # and the run's session is listed, with its agent
        sessions = client.list_sessions(agent="order-assistant").items
        assert finished.session in [s.id for s in sessions]
        assert client.list_sessions(agent="no-such-agent").items == []


def test_a_dropped_stream_resumes_with_last_event_id_every_committed_event_once(stack: LiveStack, fake: FakeOpenAI,
                                                                               django_db_blocker: Any) -> None:
    world = openai_world(django_db_blocker)
    # given a run of three steps (two tool calls, then a slowly streamed answer)
    fake.script(
        tool_calls(call("query_order", {"order_id": "O202411280001"}), delay=0.3),
        tool_calls(call("query_logistics", {"order_id": "O202411280001"}), delay=0.3),
        text(WORDS, pieces=30, chunk_delay=0.05),
        replace=True,
    )
    # and a connection that drops after the stream's first two committed events
    proxy = CuttingProxy(stack.base_url, cut_after=2)
    notices: list[RetryNotice] = []
    try:
        with Client(proxy.url, world.raw_key, on_retry=notices.append) as client:
            # when a client creates and streams the run in one call
            stream = client.create_and_stream("order-assistant", "where is order O202411280001?")
            events: list[StreamEvent] = list(stream)
    finally:
        proxy.close()
    # then the connection was cut mid-run and the client reconnected once, from the last event it had
    assert proxy.cuts == 1 and stream.reconnected == 1
    reconnect = [n for n in notices if n.reason == "reconnect"]
    assert len(reconnect) == 1 and reconnect[0].last_seq is not None and reconnect[0].last_seq >= 2
    # and every committed event arrived exactly once, in order, through the end
    seqs = [e.seq for e in events if e.seq is not None]
    committed = _committed(django_db_blocker, stream.run_id)
    assert seqs == committed and len(committed) > reconnect[0].last_seq
    assert events[-1].type == "run.finished"


def test_a_429_is_retried_after_the_apis_retry_after_with_the_same_idempotency_key(stack: LiveStack,
                                                                                 django_db_blocker: Any) -> None:
    world = openai_world(django_db_blocker)  # a key of its own: the create rate is per key
    sent: list[tuple[float, httpx.Request, int, str | None]] = []

    class Recording(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            at = time.monotonic()
            response = super().handle_request(request)
            sent.append((at, request, response.status_code, response.headers.get("Retry-After")))
            return response

    with Client(stack.base_url, world.raw_key, max_attempts=1) as once:
        # given the key's create budget spent (CREATE_RATE per second)
        created = [once.create_run("order-assistant", f"where is order {n}?") for n in range(CREATE_RATE)]
        # when a client that may not retry creates one more, the API's 429 is raised with its body and Retry-After
        with pytest.raises(RateLimited) as refused:
            once.create_run("order-assistant", "one too many")
    assert refused.value.status == 429 and refused.value.code == "throttled" and refused.value.retry_after is not None
    assert refused.value.retry_after >= 1 and "throttled" in json.dumps(refused.value.body)
    notices: list[RetryNotice] = []
    with Client(stack.base_url, world.raw_key, on_retry=notices.append, transport=Recording()) as client:
        # and a client that may retry waits as long as the API says, then creates the run with the same key
        run = client.create_run("order-assistant", "and one more, later")
    first, retry = sent[0], sent[-1]
    assert [s[2] for s in sent] == [429, 202]
    assert first[3] is not None and retry[0] - first[0] >= float(first[3])
    assert [(n.reason, n.status, n.delay) for n in notices] == [("status", 429, float(first[3]))]
    assert first[1].headers["Idempotency-Key"] == retry[1].headers["Idempotency-Key"]
    with django_db_blocker.unblock():
        assert Run.objects.filter(agent__tenant=world.tenant).count() == CREATE_RATE + 1
        assert run.id not in [c.id for c in created]


def test_a_foreign_tenants_run_and_approval_are_not_found(stack: LiveStack, django_db_blocker: Any) -> None:
    mine, theirs = openai_world(django_db_blocker), openai_world(django_db_blocker)
    with Client(stack.base_url, theirs.raw_key) as them, Client(stack.base_url, mine.raw_key) as me:
        run = them.create_run("order-assistant", "where is order O202411280001?")
        # a foreign run is a 404 on read and on stream, with the API's error body
        with pytest.raises(NotFound) as missing:
            me.get_run(run.id)
        assert missing.value.status == 404 and missing.value.code == "not_found" and missing.value.body["detail"]
        with pytest.raises(NotFound):
            next(iter(me.stream_run(run.id)))
        # and the owner still reads it
        assert them.get_run(run.id).id == run.id


def test_list_and_approve_a_pending_call_then_the_run_finishes(stack: LiveStack, django_db_blocker: Any) -> None:
    world = openai_world(django_db_blocker, model="demo/planner")
    with serve_refund_target() as target, django_db_blocker.unblock():
        add_refund_tool(world, target)
        approver = make_user(f"{world.tenant.slug}-approver")
        tenant_services.set_membership(tenant=world.tenant, user=approver, role=Role.APPROVER, actor=None)
        _key, approver_key = tenant_services.create_api_key(tenant=world.tenant, name="approver", owner=approver,
                                                            role=Role.APPROVER, actor=None)
        other = make_world()
    with Client(stack.base_url, world.raw_key) as operator, Client(stack.base_url, approver_key) as desk, \
            Client(stack.base_url, other.raw_key) as stranger:
        # given a run that waits for approval of a refund
        run = operator.create_run("order-assistant", "please refund order O202411280001")
        stack.wait_for_run(world.raw_key, run.id, statuses=("waiting",))
        # when the approver lists pending requests, the run's is there; a stranger cannot see or decide it
        pending = [a for a in desk.list_approvals().items if a.run == run.id]
        assert len(pending) == 1 and pending[0].tool_name == "refund_order" and pending[0].status == "pending"
        assert all(a.run != run.id for a in stranger.list_approvals(status=None).items)
        with pytest.raises(NotFound):
            stranger.approve(pending[0].id)
        # then approving it resumes the run to its end
        decided = desk.approve(pending[0].id, note="checked with the customer")
        assert decided.status == "approved" and decided.decisions[0].note == "checked with the customer"
        events = list(operator.stream_run(run.id))
        assert events[-1].type == "run.finished" and operator.get_run(run.id).done
    with django_db_blocker.unblock():
        assert ApprovalRequest.objects.get(run_id=run.id).status == "approved"


def test_a_flow_run_is_created_and_streamed_to_its_output(stack: LiveStack, django_db_blocker: Any) -> None:
    world = openai_world(django_db_blocker, model="demo/planner")
    flow = {"nodes": [{"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
                      {"id": "logistics", "kind": "tool", "tool": "query_logistics",
                       "inputs": {"order_id": "input.order_id"}}],
            "output": "nodes.order"}
    with stack.client(world.raw_key) as http:
        assert http.post("/api/v1/flows", json={"slug": "lookup", "name": "lookup"}).status_code == 201
        saved = http.post("/api/v1/flows/lookup/versions", json={"model": "demo/planner", "definition": flow,
                                                                  "make_current": True})
        assert saved.status_code == 201, saved.text
    with Client(stack.base_url, world.raw_key) as client:
        run = client.create_flow_run("lookup", {"order_id": "O202411280001"})
        events = [e for e in client.stream_run(run.id) if not e.is_delta]
        finished = client.get_run(run.id)
    types = [e.type for e in events]
    assert types.count("flow.node.finished") == 2 and types[-1] == "run.finished", types
    assert finished.status == "finished" and "O202411280001" in (finished.output or ""), finished
    assert [e.seq for e in events] == _committed(django_db_blocker, run.id)
