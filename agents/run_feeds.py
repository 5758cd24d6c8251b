"""One channel-layer membership per watched run per server process, instead of one per websocket.

With Channels' usual pattern every websocket joins the run's group itself, so each group message is
received, buffered and dispatched once per watcher (channels_redis: a receive lock, two tasks and an
``asyncio.wait`` per watcher per message). Here the first watcher of a run in this process opens a
:class:`RunFeed` — one channel, joined to the run's group, read by one task — and each message is
handed to every local watcher's inbox. A watcher drains its inbox in its own task, so a slow client
only delays itself; a full inbox drops the message, and the watcher heals the gap from the database
by ``seq`` when the next one arrives, exactly as when the channel layer drops a message at capacity.
The last watcher to leave closes the feed and leaves the group. Joining and leaving also record the feed in the
watched-groups registry (core/redis_layer.py, through core/live.py): publishers send only to watched runs.

Feeds belong to the event loop that opened them (a server process has one).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from core import live

log = logging.getLogger(__name__)

INBOX_SIZE = 1000  # messages (steps, deltas) a watcher may lag behind before they are dropped (steps are backfilled)


class Watcher(Protocol):
    def deliver(self, message: dict[str, Any]) -> None: ...

    def feed_lost(self) -> None: ...


class RunFeed:
    def __init__(self, layer: Any, group: str) -> None:
        self.layer = layer
        self.group = group
        self.loop = asyncio.get_running_loop()
        self.watchers: set[Watcher] = set()
        self.joined: asyncio.Future[None] = self.loop.create_future()
        self.joined.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failure is raised to the joiners
        self.channel = ""
        self.reader: asyncio.Task[None] | None = None
        self.refresher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            # The default prefix: channels_redis reads all of a process's channels through one receive loop on one
            # key per prefix ("specific.<process>!"), served by whichever receiver holds its lock.
            self.channel = await self.layer.new_channel()
            await live.join_group(self.layer, self.group, self.channel)  # and says so to the publishers (core/live.py)
        except BaseException as exc:
            _forget(self)
            if isinstance(exc, asyncio.CancelledError):
                self.joined.cancel()
            else:
                self.joined.set_exception(exc)
            raise
        self.reader = self.loop.create_task(self._read(), name=f"run-feed {self.group}")
        self.refresher = self.loop.create_task(self._refresh(), name=f"run-feed refresh {self.group}")
        self.joined.set_result(None)
        if not self.watchers:  # everyone left while it was joining
            _forget(self)
            await self.close()

    async def _read(self) -> None:
        try:
            while True:
                message = await self.layer.receive(self.channel)
                if message.get("type") in ("run.events", "run.delta"):
                    for watcher in tuple(self.watchers):
                        watcher.deliver(message)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The layer failed (e.g. Redis went away): this feed is dead. Its watchers close their sockets, so
            # clients reconnect with ``after=<last seq>`` and get the gap from the database.
            await self._end("stopped reading")

    async def _end(self, what: str) -> None:
        """The feed failed (called from its reader or its renewal, within an ``except``): its watchers close."""
        log.warning("run feed %s %s; closing its %d watchers", self.group, what, len(self.watchers), exc_info=True)
        _forget(self)
        for watcher in tuple(self.watchers):
            watcher.feed_lost()
        self.watchers.clear()
        for task in (self.reader, self.refresher):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        await self._leave_group()

    async def _refresh(self) -> None:
        """Renew the membership while the feed lives (core/live.py ``refresh_membership``: the layer's and the
        watched-groups registry's): both drop one not renewed within the group expiry, as they drop a killed process's.
        A failed renewal ends the feed as a failed read does, so its sockets close and their clients resume by seq,
        rather than silently stop receiving."""
        try:
            while True:
                await asyncio.sleep(live.refresh_every(self.layer))
                await live.refresh_membership(self.layer, self.group, self.channel)
        except asyncio.CancelledError:
            raise
        except Exception:
            await self._end("could not renew its membership")

    async def _leave_group(self) -> None:
        if self.channel:
            try:
                await live.leave_group(self.layer, self.group, self.channel)
            except Exception:
                log.info("could not leave %s (it expires on its own)", self.group, exc_info=True)

    async def close(self) -> None:
        for task in (self.reader, self.refresher):
            if task is not None:
                task.cancel()
        await self._leave_group()


_feeds: dict[tuple[int, str], RunFeed] = {}


def _forget(feed: RunFeed) -> None:
    key = (id(feed.loop), feed.group)
    if _feeds.get(key) is feed:
        del _feeds[key]


async def join(layer: Any, group: str, watcher: Watcher) -> RunFeed:
    """Add ``watcher`` to this process's feed of ``group``; returns once the feed is in the group (so a
    backlog read afterwards misses nothing)."""
    loop = asyncio.get_running_loop()
    key = (id(loop), group)
    feed = _feeds.get(key)
    if feed is None or feed.loop is not loop or feed.layer is not layer:
        feed = RunFeed(layer, group)
        _feeds[key] = feed
        feed.watchers.add(watcher)
        await feed.start()
    else:
        feed.watchers.add(watcher)
        await asyncio.shield(feed.joined)
    return feed


async def leave(feed: RunFeed, watcher: Watcher) -> None:
    feed.watchers.discard(watcher)
    if not feed.watchers and feed.joined.done():
        _forget(feed)
        await feed.close()
