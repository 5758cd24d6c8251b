"""Websocket consumers: authenticate and check the tenant in connect(), then relay."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from agents import run_feeds
from agents.models import Run, RunEvent
from agents.serializers import event_frames
from core import live
from tenants import open_streams
from tenants.feeds import HeartbeatConsumer, stop_tasks
from tenants.scoping import ANONYMOUS, Actor

log = logging.getLogger(__name__)

BACKFILL_PAGE = 500


@database_sync_to_async
def _visible_run(actor: Actor, run_id: str) -> Run | None:
    return Run.objects.for_actor(actor).filter(pk=run_id).only("id", "tenant_id").first()


@database_sync_to_async
def _events_after(run_id: Any, after: int) -> list[dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:BACKFILL_PAGE]
    return event_frames(rows)


class RunEventsConsumer(HeartbeatConsumer):
    """``/ws/runs/<id>/?after=<seq>``: the backlog from the database, then live events; ordered, no gap, no duplicate.

    Live frames come from this process's :class:`agents.run_feeds.RunFeed` of the run (one channel-layer
    membership however many sockets watch it) into this socket's inbox, drained by its own task. Everything
    that sends frames — the backlog, a gap's backfill, a live message, a client's resend request — holds
    ``_sending``, so frames leave in ``seq`` order and each once.
    """

    run_id: Any = None
    last_seq = 0
    _feed: run_feeds.RunFeed | None = None
    _pump: asyncio.Task[None] | None = None
    _resync: asyncio.Task[None] | None = None
    _overflowed = False
    _slot: open_streams.Slot | None = None
    _keeper: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        actor: Actor = self.scope.get("actor", ANONYMOUS)
        if actor is ANONYMOUS or (not actor.roles and not actor.is_superuser):
            await self.close()  # rejects the handshake (HTTP 403)
            return
        try:
            after = int(parse_qs(self.scope.get("query_string", b"").decode()).get("after", ["0"])[0])
        except ValueError:
            after = -1
        if after < 0:
            await self.close()
            return
        run = await _visible_run(actor, self.scope["url_route"]["kwargs"]["run_id"])
        if run is None:
            await self.close()  # unknown and foreign runs look the same
            return
        try:  # one of the caller's and the tenant's open streams (tenants/open_streams.py), as an SSE stream
            self._slot = await sync_to_async(open_streams.hold, thread_sensitive=False)(open_streams.caller(actor), run.tenant_id)
        except open_streams.TooManyStreams as refused:
            await self.accept()  # to say why: a refused handshake carries no reason
            await self.send_json({"type": "error", "code": "too_many_streams", "error": refused.message,
                                  "retry_after": open_streams.RETRY_AFTER_SECONDS})
            await self.close(code=open_streams.CLOSE_CODE, reason=refused.reason)
            return
        try:
            await self._open(run.pk, after)
        except BaseException:  # never connected: the slot goes back now (disconnect() is not called)
            slot, self._slot = self._slot, None
            await sync_to_async(slot.release, thread_sensitive=False)()
            raise
        self._keeper = asyncio.get_running_loop().create_task(open_streams.keep(self._slot))

    async def _open(self, run_id: Any, after: int) -> None:
        self.run_id = run_id
        self.last_seq = after
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=run_feeds.INBOX_SIZE)
        self._sending = asyncio.Lock()
        # Join the run's feed before reading the backlog, so nothing falls between the two.
        self._feed = await run_feeds.join(self.channel_layer, live.run_group(run_id), self)
        await self.accept()
        async with self._sending:
            await self._backfill()
        self._pump = asyncio.get_running_loop().create_task(self._drain_inbox())
        delay = live.resync_after()
        if delay is not None:  # the publisher may not have known this socket yet: read the database once more
            self._resync = asyncio.get_running_loop().create_task(
                self.close_on_error(lambda: self._resync_later(delay), f"of run {self.run_id} could not resync"))

    async def disconnect(self, code: int) -> None:
        await stop_tasks(self._resync, self._pump, self._keeper)
        self._resync = self._pump = self._keeper = None
        if self._feed is not None:
            await run_feeds.leave(self._feed, self)
            self._feed = None
        if self._slot is not None:
            slot, self._slot = self._slot, None
            await sync_to_async(slot.release, thread_sensitive=False)()

    def deliver(self, message: dict[str, Any]) -> None:
        """Called by the run's feed for each group message; never blocks the feed."""
        # A full inbox (this socket lags far behind) drops the message; the socket reads it from the database
        # once it has caught up.
        try:
            self._inbox.put_nowait(message)
        except asyncio.QueueFull:
            if message.get("type") == "run.events":
                self._overflowed = True  # a dropped delta is simply lost; a dropped step is backfilled

    def feed_lost(self) -> None:
        """The feed stopped (the channel layer failed): close, so the client reconnects and resumes by seq."""
        self._feed = None
        asyncio.get_running_loop().create_task(self.close(code=1011))

    async def _drain_inbox(self) -> None:
        try:
            while True:
                message = await self._inbox.get()
                async with self._sending:
                    if message.get("type") == "run.delta":
                        await self.send(text_data=message["text"])  # ephemeral: no seq, never backfilled
                        continue
                    await self.run_events(message)
                    if self._overflowed and self._inbox.empty():
                        # Caught up after dropping messages: read what they carried now, even if no later
                        # message comes to reveal the gap (the run's last step may have been among them).
                        self._overflowed = False
                        await self._backfill()
        except asyncio.CancelledError:
            raise
        except Exception:
            # E.g. the database failed during a gap's backfill. Never leave the socket open without live frames
            # (its heartbeats would hide that): close it, and the client reconnects with ``after=<last seq>``.
            log.warning("trace socket of run %s failed; closing it", self.run_id, exc_info=True)
            with contextlib.suppress(Exception):
                await self.close(code=1011)

    async def _resync_later(self, delay: float) -> None:
        """What was committed while the publisher did not know this socket yet (core/live.py ``resync_after``)."""
        await asyncio.sleep(delay)
        async with self._sending:
            await self._backfill()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients may ask for a resend from a given seq: ``{"after": <seq>}``."""
        if self.run_id is None:
            return  # refused in connect()
        if isinstance(content, dict) and isinstance(content.get("after"), int) and content["after"] >= 0:
            async with self._sending:
                self.last_seq = min(self.last_seq, content["after"])
                await self._backfill()

    async def _backfill(self) -> None:
        while True:
            frames = await _events_after(self.run_id, self.last_seq)
            for frame in frames:
                await self.send(text_data=live.encode_frame(frame))
                self.last_seq = frame["seq"]
            if len(frames) < BACKFILL_PAGE:
                return

    async def run_events(self, message: dict[str, Any]) -> None:
        """One committed step's frames, in seq order; each is sent as the publisher's pre-encoded text."""
        frames = message["events"]
        texts = message.get("texts")
        if not isinstance(texts, list) or len(texts) != len(frames):
            texts = [live.encode_frame(frame) for frame in frames]  # a publisher that sent no texts
        for frame, text in zip(frames, texts, strict=True):
            if frame["seq"] > self.last_seq + 1:
                await self._backfill()  # a message was dropped on the way: read the gap from the database
            if frame["seq"] != self.last_seq + 1:
                continue
            await self.send(text_data=text)
            self.last_seq = frame["seq"]
