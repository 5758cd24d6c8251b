"""Websocket consumers: authenticate and check the tenant in connect(), then relay."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from agents.models import Run, RunEvent
from config import live
from tenants.feeds import HeartbeatConsumer
from tenants.scoping import ANONYMOUS, Actor

BACKFILL_PAGE = 500


@database_sync_to_async
def _visible_run(actor: Actor, run_id: str) -> Run | None:
    return Run.objects.for_actor(actor).filter(pk=run_id).only("id", "tenant_id").first()


@database_sync_to_async
def _events_after(run_id: Any, after: int) -> list[dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:BACKFILL_PAGE]
    return [row.as_frame() for row in rows]


class RunEventsConsumer(HeartbeatConsumer):
    """``/ws/runs/<id>/?after=<seq>``: the backlog from the database, then live events; ordered, no gap, no duplicate."""

    run_id: Any = None
    last_seq = 0

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
        self.run_id = run.pk
        self.last_seq = after
        # Join the group before reading the backlog, so nothing falls between the two.
        await self.channel_layer.group_add(live.run_group(run.pk), self.channel_name)
        await self.accept()
        await self._backfill()

    async def disconnect(self, code: int) -> None:
        if self.run_id is not None:
            await self.channel_layer.group_discard(live.run_group(self.run_id), self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Clients may ask for a resend from a given seq: ``{"after": <seq>}``."""
        if isinstance(content, dict) and isinstance(content.get("after"), int) and content["after"] >= 0:
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

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Live frames skip Channels' per-message ``close_old_connections``.

        ``AsyncConsumer.dispatch`` hops to a worker thread to close stale database connections before *every*
        handler call: with 50 watchers of a run, 50 thread hops per frame, and the GIL ping-pong they cause was
        the largest cost of the fan-out (``bench/trace_fanout.py``). ``run_events`` touches the database only to
        backfill a gap, through ``database_sync_to_async``, which closes stale connections itself.
        """
        if message.get("type") == "run.events":
            await self.run_events(message)
        else:
            await super().dispatch(message)

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
