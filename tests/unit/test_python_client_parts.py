"""The Python client's parsing: SSE messages (a cut-off message is never delivered) and Retry-After (seconds or a date)."""

from __future__ import annotations

import contextlib
import time
from email.utils import formatdate

from agentops_client import ApiError, NotFound
from agentops_client.client import _retry_after
from agentops_client.errors import error_for
from agentops_client.sse import messages


def test_sse_messages_skip_comments_join_data_lines_and_drop_a_message_cut_off_by_a_dropped_connection() -> None:
    lines = [": run stream", "", "id: 1", 'data: {"a": 1}', "", 'data: {"type": "message.delta",', 'data: "text": "x"}', "",
             ": keep-alive", "", "id: 2", 'data: {"b"']  # the connection dropped before the blank line
    got = list(messages(lines))
    assert [(m.id, m.data) for m in got] == [("1", '{"a": 1}'), (None, '{"type": "message.delta",\n"text": "x"}')]


def test_retry_after_reads_seconds_and_http_dates_and_ignores_garbage() -> None:
    assert _retry_after("3") == 3.0 and _retry_after("0") == 0.0 and _retry_after(None) is None
    in_five = _retry_after(formatdate(time.time() + 5, usegmt=True))
    assert in_five is not None and 3 <= in_five <= 5
    assert _retry_after("soon") is None and _retry_after(formatdate(time.time() - 60, usegmt=True)) == 0.0


def test_errors_carry_the_api_error_body() -> None:
    body = {"detail": "Not found.", "error": {"code": "not_found", "message": "Not found.", "field": None}}
    error = error_for(404, body, method="GET", url="http://x/api/v1/runs/1", retry_after=None)
    assert isinstance(error, NotFound) and error.code == "not_found" and error.body == body and "404 not_found" in str(error)
    plain = error_for(418, {"detail": "teapot"}, method="GET", url="u", retry_after=None)
    assert type(plain) is ApiError and plain.message == "teapot" and plain.code == "error"


def test_a_stream_that_keeps_dropping_gives_up_after_the_bounded_reconnects_naming_the_last_event() -> None:
    import httpx
    import pytest
    from agentops_client import Client, StreamInterrupted

    class Drops(httpx.SyncByteStream):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield b'id: 1\ndata: {"seq": 1, "type": "run.started"}\n\n'
            raise httpx.RemoteProtocolError("peer closed connection")

    tries: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        tries.append(request.headers.get("Last-Event-ID"))
        if len(tries) == 1:
            return httpx.Response(200, stream=Drops(), headers={"content-type": "text/event-stream"})
        raise httpx.ConnectError("refused")

    client = Client("http://api.test", "k", transport=httpx.MockTransport(handler), sleep=lambda _: None, max_attempts=2, reconnects=2)
    stream = client.stream_run("r1")
    assert next(stream).seq == 1
    with pytest.raises(StreamInterrupted) as stopped:
        next(stream)
    # each reconnect asked for what follows seq 1; three reconnects (the bound, plus the one after progress), two tries each
    assert stopped.value.last_seq == 1 and tries[0] is None and set(tries[1:]) == {"1"} and len(tries) == 1 + 3 * 2


def test_ids_are_quoted_into_the_paths_so_an_id_cannot_reach_another_path_or_add_a_query() -> None:
    import httpx
    from agentops_client import Client

    seen: list[tuple[str, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.raw_path))
        if request.url.raw_path.endswith(b"/stream"):
            body = b'id: 1\ndata: {"seq": 1, "type": "run.finished", "payload": {"output": "ok"}}\n\n'
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        if b"/approvals/" in request.url.raw_path:
            return httpx.Response(200, json={"id": "x", "status": "pending", "tool_name": "t", "arguments": {}})
        return httpx.Response(200, json={"id": "x", "status": "succeeded"})

    hostile = "../approvals/1/approve?x=1#frag"
    quoted = b"..%2Fapprovals%2F1%2Fapprove%3Fx%3D1%23frag"
    client = Client("http://api.test", "k", transport=httpx.MockTransport(handler), sleep=lambda _: None)
    for call in (lambda: client.get_run(hostile), lambda: client.get_approval(hostile), lambda: client.approve(hostile),
                 lambda: client.reject(hostile), lambda: client.stream_run(hostile).text()):
        with contextlib.suppress(Exception):  # the stand-in answers what it may (unquoted, a stream never ends)
            call()
    assert seen == [
        ("GET", b"/api/v1/runs/" + quoted),
        ("GET", b"/api/v1/approvals/" + quoted),
        ("POST", b"/api/v1/approvals/" + quoted + b"/approve"),
        ("POST", b"/api/v1/approvals/" + quoted + b"/reject"),
        ("GET", b"/api/v1/runs/" + quoted + b"/stream"),
    ]


def test_an_id_of_dots_stays_one_segment_and_an_empty_id_is_refused() -> None:
    import httpx
    import pytest
    from agentops_client import Client

    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path)
        return httpx.Response(404, json={"detail": "Not found."})

    client = Client("http://api.test", "k", transport=httpx.MockTransport(handler), sleep=lambda _: None)
    for dots in ("..", "."):
        with pytest.raises(NotFound):
            client.get_run(dots)
    assert seen == [b"/api/v1/runs/%2E%2E", b"/api/v1/runs/%2E"]  # not /api/v1/ nor /api/v1/runs/ (dot segments)
    for empty in ("", None):
        with pytest.raises(ValueError, match="empty"):
            client.get_approval(empty)  # type: ignore[arg-type]
    assert len(seen) == 2
