"""The run trace websocket's fan-out path, in process: pre-encoded frames, gaps healed from the database, no duplicate.

The live stack tests (tests/integration) cover the same socket end to end; these pin what the fan-out work
changed (``bench/trace_fanout.py``): the publisher encodes each frame once and watchers send that text as it is,
live frames skip Channels' per-message connection clean-up, and none of it weakens the guarantees — a dropped
message is backfilled by seq, a repeated one is not sent twice, a foreign tenant's run is refused, secrets stay
masked in the text.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.layers import get_channel_layer
from django.db import transaction

from agents import run_feeds
from agents.consumers import RunEventsConsumer
from agents.models import Run, RunEvent, RunStatus, Session
from agents.serializers import event_frames
from agents.store import event_rows, publish_after_commit, run_summary
from core import live
from runtime.types import Event
from tenants.scoping import actor_for_api_key
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-live-0123456789abcdefghijABCDEFGHIJ"


def _frame(row: RunEvent) -> dict[str, Any]:
    """An event as the socket sends it (agents/serializers.py: one body for every reader)."""
    return event_frames([row])[0]


@pytest.fixture(autouse=True)
def fresh_channel_layer() -> Any:
    """Each test's event loop gets a channel layer of its own. The process caches one layer object, and the Redis
    layer keeps its receive lock across calls: an earlier test whose loop ended while a receive was waiting leaves
    it held by that dead loop, and every receive here then fails ("bound to a different event loop"; seen once in
    CI, after the whole suite, on PostgreSQL and Redis)."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def no_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests pin which way each frame comes (live, or from the database for a gap); a socket's one resync
    (core/live.py ``resync_after``; the watched-groups registry's ttl) would race them. Its own tests turn it on."""
    monkeypatch.setattr(live, "resync_after", lambda: None)


def _run(world: World) -> Run:
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    return Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session,
                              input="watch me", status=RunStatus.RUNNING)


def _commit(run: Run, count: int) -> list[RunEvent]:
    first = (RunEvent.objects.filter(run=run).order_by("-seq").values_list("seq", flat=True).first() or 0) + 1
    rows = event_rows(run, first, 1, [Event(type="tool.stage", payload={"i": first + k}) for k in range(count)])
    RunEvent.objects.bulk_create(rows)
    return rows


def _commit_elsewhere(run: Run, count: int) -> list[RunEvent]:
    """:func:`_commit` from another thread (``asyncio.to_thread``), which then closes its database connection."""
    from django.db import connection

    try:
        return _commit(run, count)
    finally:
        connection.close()


def _message(rows: list[RunEvent], texts: list[str] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "run.events", "events": [_frame(r) for r in rows]}
    if texts is not None:
        message["texts"] = texts
    return message


class Socket(ApplicationCommunicator):
    """A websocket client at the ASGI level (Channels' own WebsocketCommunicator needs daphne, which we do not install)."""

    def __init__(self, actor: Any, run: Run, after: int = 0) -> None:
        scope = {"type": "websocket", "path": f"/ws/runs/{run.pk}/", "query_string": f"after={after}".encode(),
                 "headers": [], "subprotocols": [], "actor": actor, "url_route": {"args": (), "kwargs": {"run_id": str(run.pk)}}}
        super().__init__(RunEventsConsumer.as_asgi(), scope)

    async def connect(self) -> bool:
        await self.send_input({"type": "websocket.connect"})
        return (await self.receive_output(5))["type"] == "websocket.accept"

    async def receive_from(self, timeout: float = 5) -> str:
        while True:
            message = await self.receive_output(timeout)
            assert message["type"] == "websocket.send", message
            if json.loads(message["text"]).get("type") != "heartbeat":
                return str(message["text"])

    async def send_json_to(self, content: Any) -> None:
        await self.send_input({"type": "websocket.receive", "text": json.dumps(content)})

    async def disconnect(self) -> None:
        await self.send_input({"type": "websocket.disconnect", "code": 1000})
        await self.wait(5)


async def _open(world: World, run: Run, after: int = 0) -> Socket:
    ws = Socket(await _actor(world), run, after)
    assert await ws.connect()
    return ws


async def _actor(world: World) -> Any:
    from channels.db import database_sync_to_async

    return await database_sync_to_async(actor_for_api_key)(world.key)


def _feeds_here() -> list[run_feeds.RunFeed]:
    loop = asyncio.get_running_loop()
    return [feed for feed in run_feeds._feeds.values() if feed.loop is loop]


async def _settled() -> list[Any]:
    """The watchers of this loop's feeds, once each has read its backlog (its inbox pump runs)."""
    for _ in range(500):
        watchers = [w for feed in _feeds_here() for w in feed.watchers]
        if all(w._pump is not None for w in watchers):
            return watchers
        await asyncio.sleep(0.01)
    raise AssertionError("a watcher never finished reading its backlog")


async def _texts(communicator: Socket, count: int) -> list[str]:
    return [await communicator.receive_from(timeout=5) for _ in range(count)]


def test_watchers_send_the_publishers_text_heal_a_gap_from_the_database_and_never_repeat_a_frame() -> None:
    world = make_world()
    run = _run(world)
    backlog = _commit(run, 3)

    async def scenario() -> None:
        ws = await _open(world, run)
        # the backlog, from the database, encoded as the publisher would
        assert await _texts(ws, 3) == [live.encode_frame(_frame(r)) for r in backlog]
        layer = get_channel_layer()
        group = live.run_group(run.pk)
        # a repeated message: nothing is sent again
        await layer.group_send(group, _message(backlog[-1:], [live.encode_frame(event_frames([backlog[-1]])[0])]))
        # the message of seq 4 was lost on the way; seq 5's arrives: 4 and 5 come from the database, once each
        lost_and_next = await asyncio.to_thread(_commit_elsewhere, run, 2)
        await layer.group_send(group, _message(lost_and_next[1:], [live.encode_frame(event_frames([lost_and_next[1]])[0])]))
        assert [json.loads(t)["seq"] for t in await _texts(ws, 2)] == [4, 5]
        # a live frame goes out as the publisher's text, byte for byte (not encoded again per watcher)
        live_row = (await asyncio.to_thread(_commit_elsewhere, run, 1))[0]
        marked = json.dumps({**_frame(live_row), "encoded": "by the publisher"})
        await layer.group_send(group, _message([live_row], [marked]))
        assert await ws.receive_from(timeout=5) == marked
        # a publisher that sent no texts (an older worker during a deploy) is still served
        old = (await asyncio.to_thread(_commit_elsewhere, run, 1))[0]
        await layer.group_send(group, _message([old]))
        assert json.loads(await ws.receive_from(timeout=5)) == _frame(old)
        await layer.group_send(group, _message([old], [live.encode_frame(_frame(old))]))
        assert await ws.receive_nothing(timeout=0.3)
        await ws.disconnect()

    asyncio.run(scenario())


def test_live_frames_skip_the_per_message_thread_hop_other_messages_keep_it(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    run = _run(world)
    hops: list[str] = []

    async def counting() -> None:
        hops.append("close_old_connections")

    monkeypatch.setattr("channels.consumer.aclose_old_connections", counting)

    async def scenario() -> None:
        ws = await _open(world, run)
        assert hops == ["close_old_connections"]  # the connect went through Channels' dispatch
        hops.clear()
        rows = await asyncio.to_thread(_commit_elsewhere, run, 3)
        for row in rows:
            await get_channel_layer().group_send(live.run_group(run.pk), _message([row], [live.encode_frame(_frame(row))]))
        assert [json.loads(t)["seq"] for t in await _texts(ws, 3)] == [1, 2, 3]
        assert hops == []
        await ws.send_json_to({"after": 2})  # a client's resend request still goes through Channels' dispatch
        assert json.loads(await ws.receive_from(timeout=5))["seq"] == 3
        assert hops == ["close_old_connections"]
        await ws.disconnect()

    asyncio.run(scenario())


def test_a_foreign_tenants_run_is_refused() -> None:
    world, outsider = make_world(), make_world()
    run = _run(world)

    async def scenario() -> None:
        ws = Socket(await _actor(outsider), run)
        assert not await ws.connect()  # the handshake is refused (a close before any accept)

    asyncio.run(scenario())


def test_the_publisher_encodes_each_masked_frame_once_in_seq_order(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    run = _run(world)
    sent: list[list[tuple[str, dict[str, Any]]]] = []
    monkeypatch.setattr(live, "_send", lambda pairs, *, cached=False: sent.append(pairs) if cached else None)
    events = [Event(type="tool.call", payload={"headers": {"Authorization": f"Bearer {SECRET}"}, "api_key": SECRET}),
              Event(type="tool.stage", payload={"note": f"used {SECRET}"})]
    with transaction.atomic():
        rows = event_rows(run, 1, 1, events)
        RunEvent.objects.bulk_create(rows)
        publish_after_commit(run, rows, run_summary(run))
    [(group, message), (summary_group, _)] = sent[0]
    assert group == live.run_group(run.pk) and summary_group == live.tenant_runs_group(world.tenant.pk)
    assert [f["seq"] for f in message["events"]] == [1, 2]
    assert message["texts"] == [live.encode_frame(f) for f in message["events"]]
    assert [json.loads(text) for text in message["texts"]] == message["events"]
    assert all(SECRET not in text for text in message["texts"])


def test_a_step_nobody_watches_is_not_framed_but_still_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the layer knows that nobody watches the run nor the tenant's list (core/live.py ``unwatched``), the
    step is neither framed nor handed to the publisher; its metrics are still counted, from the committed rows."""
    world = make_world()
    run = _run(world)
    sent: list[Any] = []
    observed: list[int] = []
    monkeypatch.setattr(live, "_send", lambda pairs, *, cached=False: sent.append(pairs))
    monkeypatch.setattr("agents.metrics.observe_committed", lambda run, rows: observed.append(len(rows)))
    for nobody in (True, False):
        monkeypatch.setattr(live, "unwatched", lambda run_id, tenant_id, nobody=nobody: nobody)
        with transaction.atomic():
            rows = event_rows(run, 1 if nobody else 2, 1, [Event(type="tool.stage", payload={"n": 1})])
            RunEvent.objects.bulk_create(rows)
            publish_after_commit(run, rows, run_summary(run))
    assert observed == [1, 1]
    assert len(sent) == 1 and [f["seq"] for f in sent[0][0][1]["events"]] == [2]  # only the watched step's


def test_the_watchers_of_a_run_in_one_process_share_one_feed_which_closes_with_the_last() -> None:
    world = make_world()
    run, other = _run(world), _run(world)

    async def scenario() -> None:
        sockets = [await _open(world, run) for _ in range(3)] + [await _open(world, other)]
        assert len(_feeds_here()) == 2  # one per watched run, not one per socket
        row = (await asyncio.to_thread(_commit_elsewhere, run, 1))[0]
        await get_channel_layer().group_send(live.run_group(run.pk), _message([row], [live.encode_frame(_frame(row))]))
        for ws in sockets[:3]:
            assert json.loads(await ws.receive_from(timeout=5))["seq"] == 1
        assert await sockets[3].receive_nothing(timeout=0.2)  # another run's socket gets nothing
        for ws in sockets:
            await ws.disconnect()
        assert _feeds_here() == []

    asyncio.run(scenario())


def test_a_watcher_whose_inbox_overflowed_reads_the_dropped_frames_from_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    run = _run(world)
    monkeypatch.setattr(run_feeds, "INBOX_SIZE", 1)

    async def scenario() -> None:
        ws = await _open(world, run)
        [watcher] = await _settled()
        rows = await asyncio.to_thread(_commit_elsewhere, run, 3)
        async with watcher._sending:  # the socket is busy: one message waits in its pump, one in its inbox, one is dropped
            for row in rows:
                await get_channel_layer().group_send(live.run_group(run.pk), _message([row], [live.encode_frame(_frame(row))]))
            await asyncio.sleep(0.2)
            assert watcher._inbox.qsize() == 1
        # the dropped message was the last one: no later message reveals the gap, the socket reads it once caught up
        assert [json.loads(t)["seq"] for t in await _texts(ws, 3)] == [1, 2, 3]
        assert await ws.receive_nothing(timeout=0.3)
        await ws.disconnect()

    asyncio.run(scenario())


def test_when_the_feed_cannot_read_the_layer_its_sockets_close_so_clients_resume_by_seq(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    run = _run(world)

    async def scenario() -> None:
        ws = await _open(world, run)
        await _settled()
        [feed] = _feeds_here()
        layer = feed.layer
        real_receive = layer.receive

        async def failing(channel: str) -> Any:
            if channel == feed.channel:
                raise ConnectionError("the channel layer went away")
            return await real_receive(channel)

        monkeypatch.setattr(layer, "receive", failing)
        assert feed.reader is not None
        feed.reader.cancel()  # restart the reader on the failing layer
        feed.reader = asyncio.get_running_loop().create_task(feed._read())
        closed = await ws.receive_output(5)
        assert (closed["type"], closed["code"]) == ("websocket.close", 1011)
        assert _feeds_here() == []

    asyncio.run(scenario())


def test_a_socket_whose_gap_read_fails_is_closed_rather_left_open_without_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    run = _run(world)

    async def scenario() -> None:
        ws = await _open(world, run)
        await _settled()

        async def broken(run_id: Any, after: int) -> list[dict[str, Any]]:
            raise ConnectionError("the database went away")

        monkeypatch.setattr("agents.consumers._events_after", broken)
        rows = await asyncio.to_thread(_commit_elsewhere, run, 2)  # seq 1's message is lost: a gap read is needed
        await get_channel_layer().group_send(live.run_group(run.pk), _message(rows[1:], [live.encode_frame(event_frames([rows[1]])[0])]))
        closed = await ws.receive_output(5)
        assert (closed["type"], closed["code"]) == ("websocket.close", 1011)

    asyncio.run(scenario())


BAD_FRAMES = {
    "not json": {"text": "not json"},
    "a NUL": {"text": "\x00"},
    "nested past the bound": {"text": "[" * 100_000 + "]" * 100_000},
    "a number past 4300 digits": {"text": '{"after": ' + "9" * 5000 + "}"},
    "a lone surrogate": {"text": '{"after": "\\ud800"}'},
    "a binary frame": {"bytes": b"\x00\x01"},
    "no text at all": {},
}


@pytest.mark.parametrize("frame", sorted(BAD_FRAMES))
def test_a_frame_the_socket_cannot_read_gets_an_error_frame_and_the_socket_stays_open(frame: str) -> None:
    """Channels' JSON decoding raised on these: the consumer crashed, the socket closed with 1011 and an error was
    logged. Now the client is told what the socket takes, and a good request still works after it."""
    world = make_world()
    run = _run(world)
    backlog = _commit(run, 2)

    async def scenario() -> None:
        ws = await _open(world, run)
        assert [json.loads(t)["seq"] for t in await _texts(ws, 2)] == [1, 2]
        await ws.send_input({"type": "websocket.receive", **BAD_FRAMES[frame]})
        error = json.loads(await ws.receive_from(timeout=5))
        assert error["type"] == "error" and '{"after": 12}' in error["error"], error
        await ws.send_json_to({"after": 0})  # the socket still serves: a resend from the start
        assert await _texts(ws, 2) == [live.encode_frame(_frame(r)) for r in backlog]
        await ws.disconnect()

    asyncio.run(scenario())


def test_what_was_committed_while_the_publisher_did_not_know_the_socket_arrives_by_its_resync_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The publisher may use whether anyone watches a run as read up to a ttl ago (core/redis_layer.py): a step it
    committed then was not sent to a socket that had just joined. That long after joining, the socket reads the
    database once more: the step arrives, in order, and its late live message is not sent again."""
    monkeypatch.setattr(live, "resync_after", lambda: 0.5)
    world = make_world()
    run = _run(world)
    _commit(run, 2)

    async def scenario() -> None:
        ws = await _open(world, run)
        assert [json.loads(t)["seq"] for t in await _texts(ws, 2)] == [1, 2]
        await _settled()
        unsent = await asyncio.to_thread(_commit_elsewhere, run, 2)  # committed; its message went to the members read before
        assert [json.loads(t)["seq"] for t in await _texts(ws, 2)] == [3, 4]
        await get_channel_layer().group_send(live.run_group(run.pk), _message(unsent))
        assert await ws.receive_nothing(timeout=0.8)  # and only once: no second resync either
        await ws.disconnect()

    asyncio.run(scenario())


def test_without_a_resync_a_step_sent_to_nobody_waits_for_the_next_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same step without the resync (every send asks who watches: ``LIVE_MEMBERS_TTL_SECONDS=0``, or the
    embedded layer) is not read from the database on its own: the resync above is what delivered it."""
    world = make_world()
    run = _run(world)

    async def scenario() -> None:
        ws = await _open(world, run)
        await _settled()
        await asyncio.to_thread(_commit_elsewhere, run, 1)
        assert await ws.receive_nothing(timeout=1.0)
        await ws.disconnect()

    asyncio.run(scenario())


@pytest.mark.parametrize("resync", [0.5, None], ids=["resync", "no-resync"])
def test_the_event_stream_reads_the_database_once_after_joining_too(monkeypatch: pytest.MonkeyPatch, resync: float | None) -> None:
    """``GET /api/v1/runs/<id>/stream`` (agents/sse.py) has the same one resync as the socket; its keep-alive (which
    also reads the database) is far off here, so what arrives within a second came by the resync."""
    from agents.sse import RunStream

    monkeypatch.setattr(live, "resync_after", lambda: resync)
    world = make_world()
    run = _run(world)
    _commit(run, 1)

    async def scenario() -> list[bytes]:
        stream = RunStream(run.pk, 0, keepalive=60.0).__aiter__()
        chunks = [await anext(stream), await anext(stream)]  # the opening comment, the backlog's seq 1
        await asyncio.to_thread(_commit_elsewhere, run, 2)  # committed, sent to nobody
        try:
            while True:
                chunks.append(await asyncio.wait_for(anext(stream), 1.5))
        except TimeoutError:
            pass
        await stream.aclose()
        return chunks

    chunks = asyncio.run(scenario())
    ids = [line for chunk in chunks for line in chunk.decode().splitlines() if line.startswith("id:")]
    assert ids == (["id: 1", "id: 2", "id: 3"] if resync else ["id: 1"]), chunks
