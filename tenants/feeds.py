"""Websocket consumers every app's live feed builds on: a heartbeat, and one group per tenant the actor may see.

Tenancy is decided by :mod:`tenants.scoping` (``Tenant.objects.for_actor``), as everywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from core import live
from core.parsers import loads_bounded
from tenants.models import Tenant
from tenants.scoping import ANONYMOUS, Actor

log = logging.getLogger(__name__)

#: The longest text frame a client may send (what it sends is a resend request: ``{"after": <seq>}``).
MAX_FRAME_CHARS = 4096


async def stop_tasks(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel each task (None skipped) and wait until it has ended."""
    for task in tasks:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class HeartbeatConsumer(AsyncJsonWebsocketConsumer):
    """Sends ``{"type": "heartbeat", "interval": N}`` every ``WS_HEARTBEAT_SECONDS`` while the socket is open.

    An idle socket then carries traffic on purpose: proxies with idle timeouts keep it, and a client that hears
    nothing for a few intervals knows the connection is dead and reconnects. The pages ignore these frames.
    """

    _heartbeat: asyncio.Task[None] | None = None

    async def accept(self, subprotocol: str | None = None, headers: Any = None) -> None:
        await super().accept(subprotocol, headers)
        interval = settings.WS_HEARTBEAT_SECONDS
        if interval > 0 and self._heartbeat is None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat(interval))

    async def _beat(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.send_json({"type": "heartbeat", "interval": interval})

    async def websocket_receive(self, message: dict[str, Any]) -> None:
        await self.receive(text_data=message.get("text"), bytes_data=message.get("bytes"))  # (Channels' reads ["bytes"])

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """A frame from the client: JSON text within the API body's bounds, else an ``error`` frame back saying what
        is expected (Channels' own decoding raised, and the socket closed with 1011 and an error logged)."""
        if text_data is None or len(text_data) > MAX_FRAME_CHARS:
            await self.send_json({"type": "error", "error": f"expected a JSON text frame of at most {MAX_FRAME_CHARS} "
                                  'characters, e.g. {"after": 12}'})
            return
        try:
            content = loads_bounded(text_data)
        except (ValueError, RecursionError) as exc:
            await self.send_json({"type": "error", "error": f'not a JSON frame this socket takes ({str(exc)[:200]}); '
                                  'send e.g. {"after": 12}'})
            return
        await self.receive_json(content, **kwargs)

    async def close_on_error(self, work: Callable[[], Awaitable[None]], what: str) -> None:
        """Await ``work()``; if it fails, log ``what`` and close the socket (1011), so the client reconnects (and
        resumes) rather than the socket stay open, its heartbeats hiding that it no longer delivers."""
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("a %s socket %s; closing it", type(self).__name__, what, exc_info=True)
            with contextlib.suppress(Exception):
                await self.close(code=1011)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        await stop_tasks(self._heartbeat)
        self._heartbeat = None
        await super().websocket_disconnect(message)


@database_sync_to_async
def _tenant_ids(actor: Actor, action: str) -> list[int]:
    return list(Tenant.objects.for_actor(actor, action).filter(is_active=True).values_list("pk", flat=True))


class TenantFeedConsumer(HeartbeatConsumer):
    """A one-way feed joined to one group per tenant the actor may ``tenant_action`` in (and no other).

    Subclasses name the group (``group_for``) and the handlers for the messages sent to it.
    """

    tenant_action = "view"
    groups_joined: list[str]
    #: Its groups are published with members read up to a moment ago (core/live.py ``resync_after``): then
    #: :meth:`resync` is called once, that long after joining, with what :meth:`before_joining` returned.
    resyncs = False
    _resync: asyncio.Task[None] | None = None
    _refresh: asyncio.Task[None] | None = None

    def group_for(self, tenant_id: int) -> str:
        raise NotImplementedError

    def admits(self, actor: Actor) -> bool:
        return actor is not ANONYMOUS

    async def connect(self) -> None:
        self.groups_joined = []
        actor: Actor = self.scope.get("actor", ANONYMOUS)
        if not self.admits(actor):
            await self.close()
            return
        self.actor = actor
        tenant_ids = await _tenant_ids(actor, self.tenant_action)
        delay = live.resync_after() if self.resyncs and tenant_ids else None
        before = await self.before_joining(tenant_ids) if delay is not None else None
        for tenant_id in tenant_ids:
            group = self.group_for(tenant_id)
            await live.join_group(self.channel_layer, group, self.channel_name)  # and tells the publishers (core/live.py)
            self.groups_joined.append(group)
        await self.accept()
        loop = asyncio.get_running_loop()
        if self.groups_joined:
            self._refresh = loop.create_task(self.close_on_error(self._renew_memberships, "could not renew its memberships"))
        if delay is not None:
            self._resync = loop.create_task(self.close_on_error(lambda: self._resync_later(delay, before), "could not resync"))

    async def _renew_memberships(self) -> None:
        """Renew the socket's memberships while it lives (core/live.py ``refresh_membership``): the layer drops one
        not renewed within its group_expiry, as it drops a killed process's. If a renewal fails the socket closes
        (1011, :meth:`close_on_error`), and the page reconnects, rather than stay open and silently stop receiving."""
        while True:
            await asyncio.sleep(live.refresh_every(self.channel_layer))
            for group in self.groups_joined:
                await live.refresh_membership(self.channel_layer, group, self.channel_name)

    async def _resync_later(self, delay: float, before: Any) -> None:
        await asyncio.sleep(delay)
        await self.resync(before)

    async def before_joining(self, tenant_ids: list[int]) -> Any:
        """What :meth:`resync` needs to know of the time before the socket joined its groups (see ``resyncs``)."""
        return None

    async def resync(self, before: Any) -> None:
        """Send what the groups' messages since the socket joined would have carried (once, see ``resyncs``)."""
        raise NotImplementedError

    async def disconnect(self, code: int) -> None:
        await stop_tasks(self._resync, self._refresh)
        self._resync = self._refresh = None
        for group in self.groups_joined:
            await live.leave_group(self.channel_layer, group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Nothing to receive: the feed is one-way."""
