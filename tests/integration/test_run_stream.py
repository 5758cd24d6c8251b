"""Streaming for client apps, end to end: SSE (and the websocket) against the live stack, in both run modes.

The model is the local OpenAI-compatible server (tests/support/fake_openai.py) streaming its reply slowly, reached
by the worker over HTTP through the openai SDK; clients are real HTTP clients (httpx streaming, a raw socket that
never reads, a websocket) against the real ASGI server (uvicorn).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from agents import acceptance
from agents.models import RunEvent
from tests.integration.wsclient import recv_frame
from tests.support.fake_openai import FakeOpenAI, call, text, tool_calls
from tests.support.live_stack import LiveStack
from tests.support.stream_stack import WORDS

pytestmark = pytest.mark.integration

CANARY = "sk-proj-CANARYc4n4ry0123456789abcdefQRST"
CANARY_MIDDLE = "CANARYc4n4ry0123456789"
PASSWORD = "Hunter2Canary!"
#: For a client that joins a run it did not create in the same call (a GET of the stream, the websocket): the provider
#: answers this late, so the client has joined before the first piece (deltas are not stored: a late joiner misses
#: them). A create that streams needs no delay: its stream joins the run's feed before the run is enqueued.
LATE = 0.5


def _start(stack: LiveStack, key: str, text_: str = "where is order O202411280001?") -> str:
    with stack.client(key) as http:
        response = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": text_})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _create_and_stream(stack: LiveStack, key: str, body: dict[str, Any] | None = None,
                       headers: dict[str, str] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """POST /api/v1/runs with ``Accept: text/event-stream``: the new run's id and its whole stream."""
    body = body or {"agent": "order-assistant", "input": "where is order O202411280001?"}
    with stack.client(key) as http, http.stream("POST", "/api/v1/runs", json=body, timeout=httpx.Timeout(30, read=10),
                                                headers={"Accept": "text/event-stream", **(headers or {})}) as response:
        assert response.status_code == 202 and response.headers["content-type"].startswith("text/event-stream")
        return response.headers["X-Run-Id"], _read_stream(response)


def _committed(django_db_blocker: Any, run_id: str) -> list[RunEvent]:
    with django_db_blocker.unblock():
        return list(RunEvent.objects.filter(run_id=run_id).order_by("seq"))


def _parse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """SSE messages as ``{"id": int | None, "data": frame, "raw": str, "at": monotonic}``; comments as ``{"comment": ...}``."""
    fields: dict[str, str] = {}
    raw: list[str] = []
    for line in lines:
        raw.append(line)
        if line == "":
            if "data" in fields:
                yield {"id": int(fields["id"]) if "id" in fields else None, "data": json.loads(fields["data"]),
                       "raw": "\n".join(raw), "at": time.monotonic()}
            fields, raw = {}, []
        elif line.startswith(":"):
            yield {"comment": line[1:].strip(), "raw": line, "at": time.monotonic()}
        else:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


def _read_stream(response: httpx.Response, stop_after_ids: int | None = None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    ids = 0
    for message in _parse(response.iter_lines()):
        messages.append(message)
        if message.get("id") is not None:
            ids += 1
            if stop_after_ids is not None and ids >= stop_after_ids:
                break
    return messages


def _stream(stack: LiveStack, key: str, run_id: str, headers: dict[str, str] | None = None, query: str = "",
            stop_after_ids: int | None = None) -> list[dict[str, Any]]:
    with stack.client(key) as http, http.stream("GET", f"/api/v1/runs/{run_id}/stream{query}", headers=headers,
                                                timeout=httpx.Timeout(30, read=10)) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return _read_stream(response, stop_after_ids)


def _frames(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["data"] for m in messages if "data" in m]


def test_deltas_arrive_before_the_step_commits_and_spell_the_stored_answer(stack: LiveStack, worlds: Any, fake: FakeOpenAI,
                                                                          django_db_blocker: Any) -> None:
    world, _ = worlds
    # given a model that streams a long answer slowly (40 pieces, 50 ms apart: about 2 s), answering at once
    fake.script(text(WORDS, pieces=40, chunk_delay=0.05), replace=True)
    # when a client creates the run and streams it in the same call
    run_id, messages = _create_and_stream(stack, world.raw_key)
    frames = _frames(messages)
    # then deltas came first, while the model was still writing, and the step's committed events after them
    deltas = [f for f in frames if f["type"] == "message.delta"]
    assert len(deltas) >= 5, [f["type"] for f in frames]
    step = deltas[0]["step"]
    first_delta = next(i for i, f in enumerate(frames) if f["type"] == "message.delta")
    first_commit_of_step = next(i for i, f in enumerate(frames) if f.get("seq") and f["step"] == step)
    assert first_delta < first_commit_of_step
    times = [m["at"] for m in messages if "data" in m and m["data"]["type"] == "message.delta"]
    assert times[-1] - times[0] > 0.5  # they arrived as the model wrote, not all at once after it finished
    # and the deltas spell the final message exactly from offset 0 (none was published before the stream joined),
    # which is stored as before (not per token)
    assert deltas[0]["offset"] == 0 and deltas[0]["text"] and WORDS.startswith(deltas[0]["text"])
    assert "".join(d["text"] for d in deltas) == WORDS
    assert [d["offset"] for d in deltas] == [sum(len(x["text"]) for x in deltas[:i]) for i in range(len(deltas))]
    assert frames[-1]["type"] == "run.finished" and frames[-1]["payload"]["output"] == WORDS
    committed = _committed(django_db_blocker, run_id)
    assert [m["id"] for m in messages if m.get("id") is not None] == [e.seq for e in committed]
    assert not any(e.type == "message.delta" for e in committed)
    # and deltas carry no SSE id (Last-Event-ID stays the last committed event)
    assert all(m["id"] is None for m in messages if "data" in m and m["data"]["type"] == "message.delta")


def test_a_reconnect_with_last_event_id_yields_every_committed_event_exactly_once(stack: LiveStack, worlds: Any,
                                                                                  fake: FakeOpenAI, django_db_blocker: Any) -> None:
    world, _ = worlds
    # given a run of three steps (two tool calls, then a slowly streamed answer)
    fake.script(
        tool_calls(call("query_order", {"order_id": "O202411280001"}), delay=0.3),
        tool_calls(call("query_logistics", {"order_id": "O202411280001"}), delay=0.3),
        text(WORDS, pieces=30, chunk_delay=0.05),
        replace=True,
    )
    run_id = _start(stack, world.raw_key)
    # when a client reads the first two committed events, drops the connection and reconnects with Last-Event-ID
    first = _stream(stack, world.raw_key, run_id, stop_after_ids=2)
    last_id = [m["id"] for m in first if m.get("id") is not None][-1]
    second = _stream(stack, world.raw_key, run_id, headers={"Last-Event-ID": str(last_id)})
    # then together they hold every committed event exactly once, in order
    ids = [m["id"] for m in first + second if m.get("id") is not None]
    committed = _committed(django_db_blocker, run_id)
    assert ids == [e.seq for e in committed] and len(set(ids)) == len(ids)
    assert _frames(second)[-1]["type"] == "run.finished"
    # and after= resumes the same way (Last-Event-ID wins when both are given)
    again = _stream(stack, world.raw_key, run_id, query=f"?after={last_id}")
    assert [m["id"] for m in again if m.get("id") is not None] == [e.seq for e in committed if e.seq > last_id]
    both = _stream(stack, world.raw_key, run_id, headers={"Last-Event-ID": str(len(committed) - 1)}, query="?after=0")
    assert [m["id"] for m in both if m.get("id") is not None] == [committed[-1].seq]
    # and a client resuming past the end of a finished run gets an empty stream at once, not after a keep-alive
    past = _stream(stack, world.raw_key, run_id, headers={"Last-Event-ID": str(committed[-1].seq)})
    assert [m for m in past if "data" in m] == [] and [m["comment"] for m in past] == ["run stream"]


def test_a_canary_secret_never_appears_in_any_frame_sse_or_websocket(stack: LiveStack, worlds: Any, fake: FakeOpenAI,
                                                                     django_db_blocker: Any) -> None:
    world, _ = worlds
    # given a model that writes secrets, streamed in pieces of 3 characters (every secret split across deltas)
    answer = f"Your key is {CANARY} and the password: {PASSWORD} then card 4111 1111 1111 1111. {WORDS}"
    fake.script(text(answer, pieces=len(answer) // 3, chunk_delay=0.01, delay=LATE), replace=True)
    run_id = _start(stack, world.raw_key)
    ws_frames: list[str] = []
    headers = {"Authorization": f"Bearer {world.raw_key}"}

    def watch() -> None:
        with connect(f"{stack.ws_url}/ws/runs/{run_id}/?after=0", additional_headers=headers, open_timeout=10) as ws:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                frame = recv_frame(ws, timeout=max(0.1, deadline - time.monotonic()))
                ws_frames.append(json.dumps(frame))
                if frame.get("type") == "run.finished":
                    return

    watcher = threading.Thread(target=watch)
    watcher.start()
    # when it is streamed over SSE and the websocket
    messages = _stream(stack, world.raw_key, run_id)
    watcher.join(35)
    # then deltas came (masked), on both, and no frame holds any part of a secret
    raw = "\n".join(m["raw"] for m in messages)
    deltas = [f for f in _frames(messages) if f["type"] == "message.delta"]
    assert deltas and any("message.delta" in f for f in ws_frames)
    for secret in (CANARY_MIDDLE, PASSWORD, "Hunter2", "1111 1111 1111 1111", "4111 1111"):
        assert secret not in raw, secret
        assert not any(secret in f for f in ws_frames), secret
    streamed = "".join(d["text"] for d in deltas)
    assert streamed.startswith("Your key is sk-proj-****") and "password: ******" in streamed and "**** **** **** 1111" in streamed
    assert CANARY_MIDDLE not in json.dumps([e.payload for e in _committed(django_db_blocker, run_id)])


def test_a_client_that_stops_reading_does_not_stall_the_worker(stack: LiveStack, worlds: Any, fake: FakeOpenAI) -> None:
    world, _ = worlds
    # given a model that streams a long answer in many pieces (thousands of deltas, several MB of frames)
    long_answer = " ".join(f"token{i:05d}" for i in range(20000))  # 200 KB of text
    fake.script(text(long_answer, pieces=4000), replace=True)
    run_id = _start(stack, world.raw_key)
    # and a client whose receive buffer is tiny and that never reads after sending its request
    host, port = stack.base_url.removeprefix("http://").split(":")
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    stalled.connect((host, int(port)))
    stalled.sendall(f"GET /api/v1/runs/{run_id}/stream HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {world.raw_key}\r\n"
                    "Accept: text/event-stream\r\n\r\n".encode())
    try:
        started = time.monotonic()
        # when the run goes on, then it finishes on time, and a client that reads gets every committed event
        run = stack.wait_for_run(world.raw_key, run_id, timeout=30)
        elapsed = time.monotonic() - started
        assert run["terminal_reason"] == "final_answer" and run["output"] == long_answer
        assert elapsed < 30
        reader = _stream(stack, world.raw_key, run_id)
        assert _frames(reader)[-1]["type"] == "run.finished"
        # and the stalled client is still connected, with its frames waiting unread
        stalled.setblocking(False)
        assert stalled.recv(1024)
    finally:
        stalled.close()


def test_a_foreign_tenants_run_is_a_404_and_bad_input_a_clear_400(stack: LiveStack, worlds: Any, fake: FakeOpenAI) -> None:
    world, outsider = worlds
    fake.script(text("short answer"), replace=True)
    run_id = _start(stack, world.raw_key)
    with stack.client(outsider.raw_key) as http:
        for accept in ("text/event-stream", "application/json"):
            response = http.get(f"/api/v1/runs/{run_id}/stream", headers={"Accept": accept})
            assert response.status_code == 404 and response.headers["content-type"].startswith("application/json")
        assert http.get(f"/api/v1/runs/{uuid.uuid4()}/stream").status_code == 404
    with stack.client() as anonymous:
        assert anonymous.get(f"/api/v1/runs/{run_id}/stream").status_code in (401, 403)
    with stack.client(world.raw_key) as http:
        response = http.get(f"/api/v1/runs/{run_id}/stream", headers={"Last-Event-ID": "abc", "Accept": "text/event-stream"})
        assert response.status_code == 400 and response.headers["content-type"].startswith("application/json")
        assert "non-negative integer" in response.json()["after"][0]


def test_create_and_stream_in_one_call(stack: LiveStack, worlds: Any, fake: FakeOpenAI, django_db_blocker: Any) -> None:
    world, _ = worlds
    # given a provider that answers at once (no lateness: the stream joins the run's feed before the run is enqueued)
    fake.script(text(WORDS, pieces=20, chunk_delay=0.03), text(WORDS, pieces=20, chunk_delay=0.03), replace=True)
    key = f"stream-{uuid.uuid4().hex}"
    body = {"agent": "order-assistant", "input": "where is order O202411280001?"}
    with stack.client(world.raw_key) as http:
        # when a client creates a run asking for text/event-stream
        with http.stream("POST", "/api/v1/runs", json=body, headers={"Accept": "text/event-stream", "Idempotency-Key": key}) as response:
            assert response.status_code == 202 and response.headers["content-type"].startswith("text/event-stream")
            run_id = response.headers["X-Run-Id"]
            messages = _read_stream(response)
        # then it gets the new run's stream, every delta from offset 0, to its end
        frames = _frames(messages)
        deltas = [f for f in frames if f["type"] == "message.delta"]
        assert deltas and deltas[0]["offset"] == 0 and "".join(d["text"] for d in deltas) == WORDS
        assert frames[-1]["type"] == "run.finished"
        assert [m["id"] for m in messages if m.get("id") is not None] == [e.seq for e in _committed(django_db_blocker, run_id)]
        # and the same Idempotency-Key streams the same run again (replayed), never a second run
        with http.stream("POST", "/api/v1/runs", json=body, headers={"Accept": "text/event-stream", "Idempotency-Key": key}) as again:
            assert again.status_code == 202 and again.headers["X-Run-Id"] == run_id and again.headers[acceptance.REPLAYED_HEADER] == "true"
            assert _frames(_read_stream(again))[-1]["type"] == "run.finished"
        # and "stream": true does the same without the header
        with http.stream("POST", "/api/v1/runs", json={**body, "stream": True}) as streamed:
            assert streamed.status_code == 202 and streamed.headers["content-type"].startswith("text/event-stream")
            again_frames = _frames(_read_stream(streamed))
            assert again_frames[-1]["type"] == "run.finished"
            assert next(f for f in again_frames if f["type"] == "message.delta")["offset"] == 0
        # and errors are still JSON 4xx, with the same validation as the normal create
        for bad in ({"agent": "nope", "input": "x"}, {"agent": "order-assistant"}, {**body, "stream": "sometimes"}):
            response = http.post("/api/v1/runs", json=bad, headers={"Accept": "text/event-stream"})
            assert response.status_code == 400 and response.headers["content-type"].startswith("application/json"), response.text
        assert "No agent 'nope'" in http.post("/api/v1/runs", json={"agent": "nope", "input": "x", "stream": True}).text
