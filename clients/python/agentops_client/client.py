"""The client: runs (create, get, stream, create-and-stream), sessions, approvals; retries and stream resumption.

Retries: a 429 or 503 is retried after the API's ``Retry-After`` (or a short backoff when it sends none), at most
``max_attempts`` tries in all, and never waiting longer than ``max_retry_wait`` for one; then the error is raised.
A connection error is retried only where repeating the request is safe: reads, and creates, which carry one
``Idempotency-Key`` per create call, the same on each of its retries (the API returns the run the first try made).

Streams: a run's stream is read as Server-Sent Events; when the connection drops, the client reconnects with
``Last-Event-ID`` (the seq of the last committed event it received), so every committed event arrives once, in order.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx

from agentops_client import sse
from agentops_client.errors import ApiError, StreamInterrupted, error_for
from agentops_client.models import Approval, Page, RetryNotice, Run, Session, StreamEvent, page_of

RETRY_STATUSES = frozenset({429, 503})
END_TYPE = "run.finished"
API = "/api/v1"


class Client:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        stream_read_timeout: float = 60.0,
        max_attempts: int = 4,
        max_retry_wait: float = 60.0,
        reconnects: int = 5,
        on_retry: Callable[[RetryNotice], None] | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``stream_read_timeout`` must exceed the server's ``SSE_KEEPALIVE_SECONDS`` (15 by default); ``reconnects`` is how
        many times in a row a stream may drop without delivering anything before :class:`StreamInterrupted`."""
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.max_attempts = max_attempts
        self.max_retry_wait = max_retry_wait
        self.reconnects = reconnects
        self.on_retry = on_retry
        self._sleep = sleep
        self._stream_timeout = httpx.Timeout(timeout, read=stream_read_timeout)
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout, transport=transport,
                                  headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # runs

    def create_run(self, agent: str, input: str, *, session: str | None = None, facts: dict[str, Any] | None = None,
                   idempotency_key: str | None = None) -> Run:
        """Start a run of ``agent`` (its slug) with the user's message; ``session`` continues a conversation."""
        body = _run_body(agent, input, session, facts)
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        response = self._send("POST", f"{API}/runs", json=body, headers=headers, safe=True)
        return Run.from_json(response.json())

    def create_flow_run(self, flow: str, input: dict[str, Any], *, facts: dict[str, Any] | None = None,
                        idempotency_key: str | None = None) -> Run:
        """Start a run of the flow ``flow`` (its slug) with its input object."""
        body: dict[str, Any] = {"flow": flow, "input": input}
        if facts is not None:
            body["facts"] = facts
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        response = self._send("POST", f"{API}/runs", json=body, headers=headers, safe=True)
        return Run.from_json(response.json())

    def get_run(self, run_id: str) -> Run:
        return Run.from_json(self._send("GET", f"{API}/runs/{_segment(run_id)}", safe=True).json())

    def stream_run(self, run_id: str, *, after: int = 0) -> RunStream:
        """The run's frames as they happen, from after seq ``after``, until ``run.finished``; resumes on a dropped connection."""
        _segment(run_id)  # refused here if empty, not at the first read
        return RunStream(self, str(run_id), after, None)

    def create_and_stream(self, agent: str, input: str, *, session: str | None = None, facts: dict[str, Any] | None = None,
                          idempotency_key: str | None = None) -> RunStream:
        """Start a run and stream it in one call (``POST /runs`` with ``stream: true``); ``.run_id`` is known at once."""
        body = {**_run_body(agent, input, session, facts), "stream": True}
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4()), "Accept": "text/event-stream"}
        response = self._send("POST", f"{API}/runs", json=body, headers=headers, safe=True, stream=True)
        return RunStream(self, response.headers["X-Run-Id"], 0, response)

    # sessions and approvals

    def list_sessions(self, *, agent: str | None = None, erased: bool | None = None, limit: int | None = None,
                      cursor: str | None = None) -> Page[Session]:
        params = _params(agent=agent, erased=None if erased is None else str(erased).lower(), limit=limit, cursor=cursor)
        return page_of(self._send("GET", f"{API}/sessions", params=params, safe=True).json(), Session.from_json)

    def list_approvals(self, *, status: str | None = "pending", limit: int | None = None, cursor: str | None = None) -> Page[Approval]:
        """Approval requests the key may review, oldest first (``status=None``: in every state)."""
        params = _params(status=status, limit=limit, cursor=cursor)
        return page_of(self._send("GET", f"{API}/approvals", params=params, safe=True).json(), Approval.from_json)

    def get_approval(self, approval_id: str) -> Approval:
        return Approval.from_json(self._send("GET", f"{API}/approvals/{_segment(approval_id)}", safe=True).json())

    def approve(self, approval_id: str, *, note: str = "", arguments: dict[str, Any] | None = None,
                arguments_hash: str = "") -> Approval:
        """Approve; ``arguments``: the fields to change first (approve with edits), ``arguments_hash``: the hash of
        the arguments you reviewed (the API answers 409 if they changed meanwhile)."""
        body: dict[str, Any] = {"note": note}
        if arguments is not None:
            body["arguments"] = arguments
        if arguments_hash:
            body["arguments_hash"] = arguments_hash
        return self._decide(approval_id, "approve", body)

    def reject(self, approval_id: str, *, note: str = "") -> Approval:
        return self._decide(approval_id, "reject", {"note": note})

    def _decide(self, approval_id: str, verb: str, body: dict[str, Any]) -> Approval:
        # Not retried on a connection error: the decision may have been taken (a repeat is a 409 Conflict).
        response = self._send("POST", f"{API}/approvals/{_segment(approval_id)}/{verb}", json=body, safe=False)
        return Approval.from_json(response.json())

    # transport

    def _send(self, method: str, path: str, *, json: Any = None, params: dict[str, str] | None = None,
              headers: dict[str, str] | None = None, safe: bool, stream: bool = False) -> httpx.Response:
        """The response (success only), after retries; ``safe``: a connection error may be retried too."""
        request = self._http.build_request(method, path, json=json, params=params, headers=headers,
                                           timeout=self._stream_timeout if stream else httpx.USE_CLIENT_DEFAULT)
        for attempt in range(1, self.max_attempts + 1):
            last = attempt == self.max_attempts
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError:
                if not safe or last:
                    raise
                self._wait(RetryNotice("connection", attempt, _backoff(attempt), method, str(request.url)))
                continue
            if response.status_code < 400:
                return response
            response.read()
            response.close()
            retry_after = _retry_after(response.headers.get("Retry-After"))
            error = error_for(response.status_code, _error_body(response), method=method, url=str(request.url), retry_after=retry_after)
            delay = retry_after if retry_after is not None else _backoff(attempt)
            if response.status_code not in RETRY_STATUSES or last or delay > self.max_retry_wait:
                raise error
            self._wait(RetryNotice("status", attempt, delay, method, str(request.url), response.status_code, retry_after))
        raise AssertionError("unreachable")  # pragma: no cover

    def _wait(self, notice: RetryNotice) -> None:
        if self.on_retry is not None:
            self.on_retry(notice)
        self._sleep(notice.delay)


class RunStream:
    """An iterator of :class:`StreamEvent` for one run (``run_id``), ending after ``run.finished``. Close it (or use
    ``with``) to stop early. ``last_seq`` is the last committed event received: pass it as ``after=`` to resume later."""

    def __init__(self, client: Client, run_id: str, after: int, first: httpx.Response | None) -> None:
        self.client = client
        self.run_id = run_id
        self.last_seq = after
        self.reconnected = 0
        self._first = first
        self._events = self._follow()

    def __iter__(self) -> Iterator[StreamEvent]:
        return self

    def __next__(self) -> StreamEvent:
        return next(self._events)

    def __enter__(self) -> RunStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._events.close()
        if self._first is not None:
            self._first.close()

    def text(self) -> str:
        """Read to the end; the run's final output (from ``run.finished``)."""
        output = ""
        for event in self:
            if event.type == END_TYPE:
                output = str(event.data.get("payload", {}).get("output") or "")
        return output

    def _open(self) -> httpx.Response:
        if self._first is not None:
            response, self._first = self._first, None
            return response
        headers = {"Accept": "text/event-stream"}
        if self.last_seq:
            headers["Last-Event-ID"] = str(self.last_seq)
        return self.client._send("GET", f"{API}/runs/{_segment(self.run_id)}/stream", headers=headers, safe=True, stream=True)

    def _follow(self) -> Generator[StreamEvent, None, None]:
        failures = 0
        while True:
            progressed = False
            cause: BaseException | None = None
            try:
                response = self._open()
            except httpx.TransportError as exc:  # the server unreachable for every try of this reconnect
                if self.reconnected == 0 and self.last_seq == 0:
                    raise
                response, cause = None, exc
            try:
                for message in sse.messages(response.iter_lines() if response is not None else ()):
                    event = _event(message)
                    if event.seq is not None:
                        if event.seq <= self.last_seq:
                            continue  # already delivered (never sent twice by the API; cheap to be sure)
                        self.last_seq = event.seq
                        progressed = True
                    yield event
                    if event.type == END_TYPE:
                        return
            except httpx.TransportError as exc:
                cause = exc
            finally:
                if response is not None:
                    response.close()
            if cause is None and self.client.get_run(self.run_id).done:
                return  # ended cleanly after run.finished was already delivered (e.g. resumed past it)
            failures = 0 if progressed else failures + 1
            if failures > self.client.reconnects:
                raise StreamInterrupted(self.run_id, self.last_seq, cause)
            self.reconnected += 1
            url = f"{self.client._http.base_url}{API}/runs/{_segment(self.run_id)}/stream"
            self.client._wait(RetryNotice("reconnect", failures + 1, _backoff(failures + 1) / 2, "GET", url, last_seq=self.last_seq))


def _event(message: sse.Message) -> StreamEvent:
    data = json.loads(message.data)
    seq = int(message.id) if message.id not in (None, "") else None
    return StreamEvent(type=str(data.get("type", message.event)), seq=seq, data=data)


def _run_body(agent: str, input: str, session: str | None, facts: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": agent, "input": input}
    if session is not None:
        body["session"] = str(session)
    if facts is not None:
        body["facts"] = facts
    return body


def _segment(value: Any) -> str:
    """An id as one path segment: every reserved character quoted (``/``, ``?``, ``#``, ``%``), and ``.``/``..``
    spelled out, so an id can name neither another path nor a query. An empty id is refused (it would name the list)."""
    text = "" if value is None else str(value)
    if not text:
        raise ValueError("the id is empty; pass the id of a run or an approval request")
    quoted = quote(text, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def _params(**values: Any) -> dict[str, str]:
    return {name: str(value) for name, value in values.items() if value is not None}


def _backoff(attempt: int) -> float:
    return float(min(0.5 * 2 ** (attempt - 1), 8.0))


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _error_body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"detail": response.text[:500]}
    return body if isinstance(body, dict) else {"detail": body}


__all__ = ["ApiError", "Client", "RunStream"]
