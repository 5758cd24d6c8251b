"""The Redis channel layer: channels_redis's, plus one synchronous send of several group messages.

The publisher thread (core/live.py) sends each committed step's two messages (the run's watchers, the tenant's
run list). channels_redis's ``group_send`` takes two round trips per group even when nobody watches (drop expired
members, read the members), through redis-py's asyncio client: four round trips and about 0.4 ms of CPU a step,
which the committing thread felt through the GIL. :meth:`RedisLayer.send_groups` does the same work with the
synchronous client: every group's members in one pipeline, then, only for groups with members, their messages in
one more (the same expiry, capacity check and Lua script as ``group_send``, so every consumer of the stock layer
receives them exactly as before). The receiving side is channels_redis's, unchanged.

A run's trace has nobody watching most of the time, and even that answer cost a round trip a step (about 0.4 ms of
the committing thread's time on two cores, ``bench/step_overhead.py``). A caller may therefore let the members be
read at most once per ``members_ttl`` seconds (``LIVE_MEMBERS_TTL_SECONDS``; ``cached=True``). This layer's
``group_add`` announces each join on a pub/sub channel, and a listener thread per process and host forgets that
group's remembered members as soon as it hears it, so a new watcher gets the next message live; while the listener is
not subscribed nothing is remembered. A join whose word is lost all the same (or one that raced a read) may miss
what is sent until the members are read again: the watchers of those groups read the database once more that long
after joining (``core.live.resync_after``), so every committed event still reaches them, in order, once. Groups
whose watchers do not resync (approvals) are sent uncached.

It reads these of the layer (channels-redis is pinned in requirements.txt; tests/db/test_redis_layer.py fails when
an upgrade changes them): ``hosts``, ``consistent_hash``, ``_group_key``, ``_map_channel_keys_to_connection`` (the
per-channel serialised messages and capacities) and ``group_send``'s Lua script (:data:`GROUP_SEND_LUA`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import redis
from channels_redis.core import RedisChannelLayer

log = logging.getLogger(__name__)

#: channels_redis 4.3.0's ``group_send`` script: add the message to each channel under its capacity.
GROUP_SEND_LUA = """
                local over_capacity = 0
                local current_time = ARGV[#ARGV - 1]
                local expiry = ARGV[#ARGV]
                for i=1,#KEYS do
                    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
                        redis.call('ZADD', KEYS[i], current_time, ARGV[i])
                        redis.call('EXPIRE', KEYS[i], expiry)
                    else
                        over_capacity = over_capacity + 1
                    end
                end
                return over_capacity
            """

#: The publisher's reads and writes give up after this long (the layer's own timeout is long: it blocks on reads).
SEND_TIMEOUT_SECONDS = 5.0


class RedisLayer(RedisChannelLayer):  # type: ignore[misc]  # channels_redis is untyped
    def __init__(self, *args: Any, members_ttl: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.members_ttl = max(0.0, float(members_ttl))
        self._members: dict[str, tuple[float, list[str]]] = {}  # group -> (when read, monotonic; its members)
        self._listening: dict[int, bool] = {}  # host -> its listener is subscribed (else nothing is read from cache)
        self._epoch = 0  # counts the changes the listeners heard: a read that overlapped one is not remembered
        self._epochs = itertools.count(1)  # next() is atomic: listeners of several hosts may count at once
        self._sync: dict[int, redis.Redis] = {}
        self._sync_pid = 0
        self._sync_lock = threading.Lock()

    @property
    def members_channel(self) -> str:
        """Where every ``group_add`` says which group gained a member (Redis pub/sub, one channel per prefix)."""
        return f"{self.prefix}:members-changed"

    async def group_add(self, group: str, channel: str) -> None:
        """channels_redis's ``group_add``, then a word to every publisher that remembers the group's members, so its
        next send reads them again (best effort: the watchers' resync covers a word lost)."""
        await super().group_add(group, channel)
        if self.members_ttl > 0:
            try:
                await self.connection(self.consistent_hash(group)).publish(self.members_channel, group)
            except Exception:
                log.info("could not announce a new member of %s; its watchers resync", group, exc_info=True)

    async def group_refresh(self, group: str, channel: str) -> None:
        """Keep a live member in its group (channels_redis's ``group_add``: its join time set to now), unannounced: a
        member refreshed is not a new one. Members not refreshed within ``group_expiry`` (a killed server process's)
        are dropped at the next read, instead of being sent every step for a day."""
        await super().group_add(group, channel)

    def nobody_in(self, groups: Iterable[str]) -> bool:
        """Whether a cached :meth:`send_groups` of these groups would send nothing, by what is remembered now (never
        asking Redis): each group's members read less than ``members_ttl`` ago, none, and its host's listener
        subscribed. A caller that gets True may skip preparing the messages at all."""
        if self.members_ttl <= 0 or self._sync_pid != os.getpid():
            return False
        now = time.monotonic()
        for group in groups:
            known = self._members.get(group)
            if (known is None or known[1] or now - known[0] >= self.members_ttl
                    or not self._listening.get(self.consistent_hash(group), False)):
                return False
        return True

    def _ensure_listener(self, index: int) -> bool:
        """Whether host ``index``'s listener is subscribed (starting it the first time): only then may members read
        from that host be remembered."""
        with self._sync_lock:
            self._this_process()
            if index not in self._listening:
                self._listening[index] = False
                threading.Thread(target=_listen, args=(weakref.ref(self), index, os.getpid()),
                                 name=f"agentops-members-{index}", daemon=True).start()
            return self._listening[index]

    def _this_process(self) -> None:
        """A forked child starts with no clients, listeners or remembered members of its parent's (under the lock)."""
        if self._sync_pid != os.getpid():
            self._sync, self._sync_pid, self._members, self._listening = {}, os.getpid(), {}, {}

    def _client(self, index: int) -> redis.Redis:
        """A synchronous client for host ``index`` (a forked child makes its own)."""
        with self._sync_lock:
            self._this_process()
            client = self._sync.get(index)
            if client is None:
                host = dict(self.hosts[index])
                if "address" not in host:  # sentinels and the like: not configured here
                    raise NotImplementedError("send_groups needs a host given by its address")
                address = host.pop("address")
                host["socket_timeout"] = min(float(host.get("socket_timeout") or SEND_TIMEOUT_SECONDS), SEND_TIMEOUT_SECONDS)
                client = self._sync[index] = redis.Redis.from_url(address, **host)
            return client

    def send_groups(self, messages: list[tuple[str, dict[str, Any]]], *, cached: bool = False) -> None:
        """``group_send(group, message)`` for each pair, in order, from a synchronous thread: one round trip per host
        when no group has members, two when some have. ``cached``: a group's members read less than ``members_ttl``
        seconds ago are used as read (none when no group has members: no round trip at all)."""
        now, epoch = time.monotonic(), self._epoch
        fresh = cached and self.members_ttl > 0
        names_of: dict[int, list[str]] = {}  # position in ``messages`` -> the group's members
        by_host: dict[int, list[tuple[int, str]]] = defaultdict(list)
        subscribed: dict[int, bool] = {}  # host -> its listener was subscribed before anything here was read
        for position, (group, _) in enumerate(messages):
            assert self.require_valid_group_name(group), "Group name not valid"
            index = self.consistent_hash(group)
            if fresh and index not in subscribed:
                subscribed[index] = self._ensure_listener(index)
            known = self._members.get(group) if subscribed.get(index) else None
            if known is not None and now - known[0] < self.members_ttl:
                names_of[position] = known[1]
            else:
                by_host[index].append((position, group))
        if fresh and len(self._members) > 1000:  # one entry per recently published run: drop the stale ones
            self._members = {g: k for g, k in self._members.items() if now - k[0] < self.members_ttl}
        for index, groups in by_host.items():
            pipe = self._client(index).pipeline(transaction=False)
            expired = time.time() - self.group_expiry  # not truncated: a member is kept group_expiry, not up to 1 s longer
            for _, group in groups:
                key = self._group_key(group)
                pipe.zremrangebyscore(key, min=0, max=expired)
                pipe.zrange(key, 0, -1)
            replies = pipe.execute()
            # remembered only if the listener heard every announcement since before the read, and there was none
            heard = subscribed.get(index, False) and self._listening.get(index, False) and self._epoch == epoch
            for (position, group), names in zip(groups, replies[1::2], strict=True):
                names_of[position] = [name.decode("utf8") for name in names]
                if heard:
                    self._members[group] = (now, names_of[position])
        members = [(group, message, names_of[position]) for position, (group, message) in enumerate(messages)
                   if names_of[position]]
        if not members:
            return
        sends: dict[int, list[tuple[str, int, list[Any], list[Any]]]] = defaultdict(list)
        for group, message, names in members:
            keys_by_host, key_message, key_capacity = self._map_channel_keys_to_connection(names, message)
            for index, keys in keys_by_host.items():
                args = [key_message[k] for k in keys] + [key_capacity[k] for k in keys]
                sends[index].append((group, len(names), keys, args))
        for index, batch in sends.items():
            pipe = self._client(index).pipeline(transaction=False)
            stale = int(time.time()) - int(self.expiry)
            for _, _, keys, _ in batch:
                for key in keys:
                    pipe.zremrangebyscore(key, min=0, max=stale)
            for _, _, keys, args in batch:
                pipe.eval(GROUP_SEND_LUA, len(keys), *keys, *args, time.time(), self.expiry)
            over = pipe.execute()[-len(batch):]
            for (group, count, _, _), dropped in zip(batch, over, strict=True):
                if dropped:
                    log.info("%s of %s channels over capacity in group %s", dropped, count, group)


def _listen(ref: weakref.ref[RedisLayer], index: int, pid: int) -> None:
    """A layer's listener on host ``index``: forgets a group's remembered members as soon as a ``group_add`` anywhere
    announces a new one. While not subscribed (Redis down, reconnecting) the layer remembers nothing: every send reads
    the members. It holds the layer weakly and ends with it (or in a forked child, which starts its own)."""
    backoff = 0.5
    while True:
        layer = ref()
        if layer is None or layer._sync_pid != pid:
            return
        pubsub = None
        try:
            pubsub = layer._client(index).pubsub()  # type: ignore[no-untyped-call]
            pubsub.subscribe(layer.members_channel)
            while layer is not None and layer._sync_pid == pid:
                message = pubsub.get_message(timeout=1.0)
                if message is not None and message["type"] == "subscribe":
                    layer._epoch = next(layer._epochs)  # a read begun before this (re)subscription is not remembered
                    layer._members, layer._listening[index] = {}, True  # what was remembered unheard is dropped
                    backoff = 0.5
                elif message is not None and message["type"] == "message":
                    layer._epoch = next(layer._epochs)
                    layer._members.pop(message["data"].decode("utf8", "replace"), None)
                layer = None  # held weakly between messages: a layer dropped by its process ends its listener
                layer = ref()
        except Exception:
            log.info("members listener of Redis host %s stopped; reading members at every send until it is back",
                     index, exc_info=True)
        finally:
            layer = ref()
            if layer is not None:
                layer._listening[index] = False
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    pubsub.close()
        if layer is None:
            return
        del layer
        time.sleep(backoff)
        backoff = min(backoff * 2, 10.0)
