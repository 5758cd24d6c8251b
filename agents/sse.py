"""``GET /api/v1/runs/<id>/stream``: a run as Server-Sent Events, the same frames as its websocket.

Each committed trace event is one SSE message whose ``id:`` is its ``seq``; ``message.delta`` frames
(the model's text as it streams, masked in the worker, see agents/run_deltas.py) carry no id, so a
client's ``Last-Event-ID`` is always the last committed event it saw. A stream joins the run's feed
first (agents/run_feeds.py), then sends the backlog after ``Last-Event-ID`` (or ``after=``) from the
database, then relays live frames, skipping those already sent and backfilling any gap by ``seq``:
no gap, no duplicate. It ends after ``run.finished``.

Bounded: the stream's inbox holds ``run_feeds.INBOX_SIZE`` messages; when a client stops reading, the
ASGI server's send waits, the inbox fills, and further messages are dropped — deltas are lost, steps
are read from the database once the client reads again. The worker and the feed never wait for a
client. Every ``KEEPALIVE_SECONDS`` without a frame a comment line is sent, and the database is read
for anything a dropped message carried (e.g. the run's last step).

Held open: a stream is an async iterator sent from the event loop by Django's ASGI handler, and its request's
synchronous work runs on the process's one stream thread (core/stream_thread.py), so while it waits it holds no
thread, only its place in the run's feed and a slot among the caller's and the tenant's open
streams (tenants/open_streams.py: taken by the view, a 429 past the bound; renewed here; given back when the
response is closed). Its reads of the database are short calls on that thread, each giving its connection back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.http import StreamingHttpResponse

from agents import run_feeds
from agents.models import Run, RunEvent, RunStatus
from agents.serializers import event_frames
from core import live
from tenants import open_streams

log = logging.getLogger(__name__)

BACKFILL_PAGE = 500
END_TYPE = "run.finished"


def event_message(text: str, seq: int | None = None) -> bytes:
    """One SSE message: ``id: <seq>`` for committed events, then the frame's JSON (one line)."""
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}data: {text}\n\n".encode()


@database_sync_to_async
def _events_after(run_id: Any, after: int) -> list[dict[str, Any]]:
    return event_frames(RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:BACKFILL_PAGE])


@database_sync_to_async
def _is_finished(run_id: Any) -> bool:
    return Run.objects.filter(pk=run_id, status=RunStatus.FINISHED).exists()


class _Inbox:
    """This stream's place in the run's feed: never blocks the feed; a full inbox drops the message."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=run_feeds.INBOX_SIZE)
        self.overflowed = False
        self.lost = False

    def deliver(self, message: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(message)
        except asyncio.QueueFull:
            if message.get("type") == "run.events":
                self.overflowed = True

    def feed_lost(self) -> None:
        self.lost = True


class Once:
    """Calls ``action`` the first time it is called (from any thread), never again."""

    def __init__(self, action: Callable[[], Any]) -> None:
        self._action: Callable[[], Any] | None = action
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            action, self._action = self._action, None
        if action is not None:
            action()


class RunStream:
    """``on_joined`` (a create that streams: enqueue the run) is called once the stream is in the run's feed, before
    anything is read, so nothing the run publishes can come before its subscriber."""

    def __init__(self, run_id: Any, after: int, keepalive: float, on_joined: Once | None = None,
                 slot: open_streams.Slot | None = None) -> None:
        self.run_id = run_id
        self.last_seq = after
        self.keepalive = keepalive
        self.ended = False
        self.on_joined = on_joined
        self.slot = slot

    async def _backfill(self) -> list[bytes]:
        out: list[bytes] = []
        while True:
            frames = await _events_after(self.run_id, self.last_seq)
            for frame in frames:
                out.append(event_message(live.encode_frame(frame), frame["seq"]))
                self.last_seq = frame["seq"]
                self.ended = self.ended or frame["type"] == END_TYPE
            if len(frames) < BACKFILL_PAGE:
                return out

    async def _relay(self, message: dict[str, Any]) -> list[bytes]:
        if message.get("type") == "run.delta":
            return [event_message(message["text"])]
        out: list[bytes] = []
        frames = message["events"]
        texts = message.get("texts")
        if not isinstance(texts, list) or len(texts) != len(frames):
            texts = [live.encode_frame(frame) for frame in frames]
        for frame, text in zip(frames, texts, strict=True):
            if frame["seq"] > self.last_seq + 1:
                out += await self._backfill()  # a message was dropped on the way: the gap from the database
            if frame["seq"] != self.last_seq + 1:
                continue
            out.append(event_message(text, frame["seq"]))
            self.last_seq = frame["seq"]
            self.ended = self.ended or frame["type"] == END_TYPE
        return out

    def close(self) -> None:
        """Called by Django when the response is closed, however the stream ended (a streaming response calls its
        content's ``close``): a run that never joined starts all the same, the slot is given back."""
        try:
            if self.on_joined is not None:
                self.on_joined()
        finally:
            if self.slot is not None:
                self.slot.release()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """The stream's messages, while its slot's lease is renewed (tenants/open_streams.py; given back on close)."""
        keeper = asyncio.create_task(open_streams.keep(self.slot)) if self.slot is not None else None
        try:
            async with contextlib.aclosing(self._messages()) as messages:
                async for chunk in messages:
                    yield chunk
        finally:
            if keeper is not None:
                keeper.cancel()

    async def _messages(self) -> AsyncIterator[bytes]:
        layer = get_channel_layer()
        inbox = _Inbox()
        try:
            feed = await run_feeds.join(layer, live.run_group(self.run_id), inbox) if layer is not None else None
        finally:
            if self.on_joined is not None:  # joined (or failed to: the run must start all the same)
                await sync_to_async(self.on_joined, thread_sensitive=False)()
        try:
            yield b": run stream\n\n"  # the headers and a first byte go out at once
            for chunk in await self._backfill():  # joined first, so nothing falls between backlog and live
                yield chunk
            if not self.ended and await _is_finished(self.run_id):
                for chunk in await self._backfill():  # it finished just now, or the client resumed past its end
                    yield chunk
                return
            loop = asyncio.get_running_loop()
            delay = live.resync_after() if feed is not None else None
            resync_at = loop.time() + delay if delay is not None else None  # the publisher may not have known us yet
            while not self.ended and not inbox.lost:  # a lost feed ends the stream: the client resumes by Last-Event-ID
                if resync_at is not None and loop.time() >= resync_at:
                    resync_at = None  # once: what was committed before the publisher knew this stream's feed
                    for chunk in await self._backfill():
                        yield chunk
                    if self.ended or await _is_finished(self.run_id):
                        return
                wait = self.keepalive if resync_at is None else max(0.0, min(self.keepalive, resync_at - loop.time()))
                try:
                    message = await asyncio.wait_for(inbox.queue.get(), wait)
                except TimeoutError:
                    if resync_at is not None and loop.time() >= resync_at:
                        continue  # the resync above, not a keep-alive
                    yield b": keep-alive\n\n"
                    for chunk in await self._backfill():  # heals a dropped last step
                        yield chunk
                    if not self.ended and await _is_finished(self.run_id):
                        return  # finished without a run.finished event after our position (e.g. resumed past it)
                    continue
                for chunk in await self._relay(message):
                    yield chunk
                if inbox.overflowed and inbox.queue.empty():
                    inbox.overflowed = False
                    for chunk in await self._backfill():
                        yield chunk
        finally:
            if feed is not None and not inbox.lost:
                await run_feeds.leave(feed, inbox)


def parse_resume(last_event_id: str | None, after: str | None) -> int:
    """Where to resume: ``Last-Event-ID`` (sent by an EventSource on reconnect) wins over ``after=``; -1 if invalid."""
    raw = last_event_id if last_event_id not in (None, "") else after
    if raw in (None, ""):
        return 0
    try:
        value = int(str(raw).strip())
    except ValueError:
        return -1
    return value if value >= 0 else -1


def stream_response(run_id: Any, after: int, status: int = 200, headers: dict[str, str] | None = None,
                    on_joined: Once | None = None, slot: open_streams.Slot | None = None) -> StreamingHttpResponse:
    """The run's stream; ``on_joined`` is called once it has joined the run's feed, or when the response is closed
    if it never started (a client gone before the first byte: the run starts all the same). ``slot`` (the caller's
    place among its open streams) is given back when the response is closed, however the stream ended."""
    response = StreamingHttpResponse(
        RunStream(run_id, after, settings.SSE_KEEPALIVE_SECONDS, on_joined, slot),
        content_type="text/event-stream", status=status,
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front must not buffer the stream
    for name, value in (headers or {}).items():
        response[name] = value
    return response
