"""Issue #49, hole 7: open streams are bounded per API key and per tenant, and an open stream holds no thread.

Against the live stack (a real server, real HTTP clients): a key past its bound gets a 429 with ``Retry-After`` and
the API's error body, for an event stream (SSE) and for the trace websocket alike; the tenant's bound holds across its
keys; another tenant is not affected; a closed stream frees its slot. And thirty streams left open do not add thirty
threads to the server process (each kept the thread of its request for its whole life: 64 threads grew to 209).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from accounts import services as tenant_services
from agents.models import Run, Session
from tenants.models import Role
from tests.factories import World
from tests.integration.wsclient import recv_frame
from tests.support.live_stack import LiveStack

pytestmark = pytest.mark.integration

PER_KEY, PER_TENANT = 30, 40
STREAM_STACK_ENV = {"MAX_OPEN_STREAMS_PER_KEY": str(PER_KEY), "MAX_OPEN_STREAMS_PER_TENANT": str(PER_TENANT)}


def _server_threads(stack: LiveStack) -> int:
    status = Path(f"/proc/{stack.processes['server'].pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def _open_run(django_db_blocker: Any, world: World) -> str:
    """A run that stays queued while the test lasts (no worker was asked to run it; the sweeper waits a minute before
    it enqueues a queued run): its streams stay open."""
    with django_db_blocker.unblock():
        session = Session.objects.create(tenant=world.tenant, agent=world.agent)
        run = Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input="hi")
    return str(run.pk)


class Streams:
    """Event streams of one run held open by one client, each read up to its first byte (the server has sent it)."""

    def __init__(self, stack: LiveStack, key: str, run_id: str) -> None:
        self.http = httpx.Client(base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=httpx.Timeout(20), limits=httpx.Limits(max_connections=None))
        self.run_id = run_id
        self.open: list[tuple[contextlib.ExitStack, Iterator[bytes]]] = []

    def try_open(self) -> httpx.Response:
        """Open one more; an open stream is kept, a refusal is returned read."""
        held = contextlib.ExitStack()
        response = held.enter_context(self.http.stream("GET", f"/api/v1/runs/{self.run_id}/stream",
                                                       headers={"Accept": "text/event-stream"}))
        if response.status_code != 200:
            response.read()
            held.close()
            return response
        chunks = response.iter_bytes()  # kept: a reader collected as garbage closes its connection
        assert next(chunks).startswith(b": run stream")
        self.open.append((held, chunks))
        return response

    def open_all(self, count: int) -> None:
        for _ in range(count):
            response = self.try_open()
            assert response.status_code == 200, response.text

    def close_one(self) -> None:
        self.open.pop()[0].close()

    def close(self) -> None:
        while self.open:
            self.close_one()
        self.http.close()


@pytest.fixture
def streams(stack: LiveStack) -> Iterator[Any]:
    made: list[Streams] = []

    def make(key: str, run_id: str) -> Streams:
        made.append(Streams(stack, key, run_id))
        return made[-1]

    yield make
    for each in made:
        each.close()


def _eventually_opens(streams: Streams, seconds: float = 10) -> httpx.Response:
    """A slot freed by a closed stream is free once the server has seen the client go (a moment later)."""
    deadline = time.monotonic() + seconds
    while True:
        response = streams.try_open()
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


@contextlib.contextmanager
def _socket_once_free(stack: LiveStack, key: str, run_id: str, seconds: float = 10) -> Iterator[Any]:
    """The run's trace websocket, opened once a slot is free (a closed stream's is, a moment after it closed)."""
    deadline = time.monotonic() + seconds
    while True:
        with connect(f"{stack.ws_url}/ws/runs/{run_id}/?after=0", additional_headers={"Authorization": f"Bearer {key}"},
                     open_timeout=10) as ws:
            try:
                frame = recv_frame(ws, timeout=0.5)
            except TimeoutError:  # open, and nothing to say: the run has no events yet
                yield ws
                return
        assert frame.get("code") == "too_many_streams" and time.monotonic() < deadline, frame
        time.sleep(0.1)


def test_thirty_open_streams_do_not_hold_thirty_threads(stack: LiveStack, worlds: tuple[World, World], streams: Any,
                                                        django_db_blocker: Any) -> None:
    world, _ = worlds
    run_id = _open_run(django_db_blocker, world)
    held = streams(world.raw_key, run_id)
    held.open_all(2)  # the server's threads for a request and a stream exist before counting
    held.close()
    time.sleep(0.5)
    before = _server_threads(stack)
    # when a client opens thirty streams of a run under way, one after the other, and leaves them open
    held = streams(world.raw_key, run_id)
    held.open_all(30)
    time.sleep(1.5)  # a keep-alive or two (SSE_KEEPALIVE_SECONDS=1): each stream has read the database since
    during = _server_threads(stack)
    # then the server process has about as many threads as before (each stream held one: thirty more)
    assert during - before < 8, (before, during)


def test_streams_past_a_keys_or_its_tenants_bound_are_refused_and_a_closed_one_frees_its_slot(
        stack: LiveStack, worlds: tuple[World, World], streams: Any, django_db_blocker: Any) -> None:
    world, outsider = worlds
    run_id = _open_run(django_db_blocker, world)
    mine = streams(world.raw_key, run_id)
    # given a key with PER_KEY streams open
    mine.open_all(PER_KEY)
    # when it opens one more, then it is refused: 429, Retry-After, the API's error body saying what and why
    refused = mine.try_open()
    assert refused.status_code == 429, refused.status_code
    assert int(refused.headers["Retry-After"]) > 0
    assert refused.headers["content-type"].startswith("application/json")
    error = refused.json()["error"]
    assert error["code"] == "too_many_streams" and f"{PER_KEY} streams" in error["message"] and "API key" in error["message"]
    # and so is a create that would stream its new run, before any run is created
    with django_db_blocker.unblock():
        runs = Run.objects.filter(tenant=world.tenant).count()
    with stack.client(world.raw_key) as http:
        create = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": "hello", "stream": True})
    assert create.status_code == 429 and create.json()["error"]["code"] == "too_many_streams", create.text
    with django_db_blocker.unblock():
        assert Run.objects.filter(tenant=world.tenant).count() == runs
    # and its trace websocket is refused the same way: an error frame saying why, then closed with 4429 and a reason
    with connect(f"{stack.ws_url}/ws/runs/{run_id}/?after=0", additional_headers={"Authorization": f"Bearer {world.raw_key}"},
                 open_timeout=10) as ws:
        frame = recv_frame(ws, timeout=10)
        assert frame["type"] == "error" and frame["code"] == "too_many_streams" and frame["retry_after"] > 0, frame
        with pytest.raises(ConnectionClosed) as closed:
            recv_frame(ws, timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4429
    assert "too many open streams" in closed.value.rcvd.reason
    # and a second key of the same tenant opens streams up to the tenant's bound, then is refused for the tenant
    with django_db_blocker.unblock():
        _, second_key = tenant_services.create_api_key(tenant=world.tenant, name="second", owner=world.operator,
                                                       role=Role.OPERATOR, actor=None)
    teammate = streams(second_key, run_id)
    teammate.open_all(PER_TENANT - PER_KEY)
    over_tenant = teammate.try_open()
    assert over_tenant.status_code == 429 and "tenant" in over_tenant.json()["error"]["message"], over_tenant.text
    # and another tenant's key still opens a stream of its own run
    other_run = _open_run(django_db_blocker, outsider)
    assert streams(outsider.raw_key, other_run).try_open().status_code == 200
    # and once the first key closes one of its streams, it may open one again (and only one)
    mine.close_one()
    assert _eventually_opens(mine).status_code == 200
    assert mine.try_open().status_code == 429
    # and an open trace websocket holds a slot as an event stream does, given back when it closes
    mine.close_one()
    with _socket_once_free(stack, world.raw_key, run_id):
        assert mine.try_open().status_code == 429
    assert _eventually_opens(mine).status_code == 200
