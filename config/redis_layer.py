"""The Redis channel layer: channels_redis's, plus one synchronous send of several group messages.

The publisher thread (config/live.py) sends each committed step's two messages (the run's watchers, the tenant's
run list). channels_redis's ``group_send`` takes two round trips per group even when nobody watches (drop expired
members, read the members), through redis-py's asyncio client: four round trips and about 0.4 ms of CPU a step,
which the committing thread felt through the GIL. :meth:`RedisLayer.send_groups` does the same work with the
synchronous client: every group's members in one pipeline, then, only for groups with members, their messages in
one more (the same expiry, capacity check and Lua script as ``group_send``, so every consumer of the stock layer
receives them exactly as before). The receiving side is channels_redis's, unchanged.

A run's trace has nobody watching most of the time, and even that answer cost a round trip a step (about 0.4 ms of
the committing thread's time on two cores, ``bench/step_overhead.py``). A caller may therefore let the members be
read at most once per ``members_ttl`` seconds (``LIVE_MEMBERS_TTL_SECONDS``; ``cached=True``): a watcher that
joins a group may then miss the messages sent within that time after it joined, and the watchers of those groups
read the database once more when that time has passed since they joined (:data:`config.live.RESYNC_AFTER_SECONDS`),
so every committed event still reaches them, in order, once. Groups whose watchers do not resync (approvals) are
sent uncached.

It reads these of the layer (channels-redis is pinned in requirements.txt; tests/db/test_redis_layer.py fails when
an upgrade changes them): ``hosts``, ``consistent_hash``, ``_group_key``, ``_map_channel_keys_to_connection`` (the
per-channel serialised messages and capacities) and ``group_send``'s Lua script (:data:`GROUP_SEND_LUA`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
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
        self._sync: dict[int, redis.Redis] = {}
        self._sync_pid = 0
        self._sync_lock = threading.Lock()

    def _client(self, index: int) -> redis.Redis:
        """A synchronous client for host ``index`` (a forked child makes its own)."""
        with self._sync_lock:
            if self._sync_pid != os.getpid():
                self._sync, self._sync_pid, self._members = {}, os.getpid(), {}
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
        now = time.monotonic()
        fresh = cached and self.members_ttl > 0
        names_of: dict[int, list[str]] = {}  # position in ``messages`` -> the group's members
        by_host: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for position, (group, _) in enumerate(messages):
            assert self.require_valid_group_name(group), "Group name not valid"
            known = self._members.get(group) if fresh else None
            if known is not None and now - known[0] < self.members_ttl:
                names_of[position] = known[1]
            else:
                by_host[self.consistent_hash(group)].append((position, group))
        if fresh and len(self._members) > 1000:  # one entry per recently published run: drop the stale ones
            self._members = {g: k for g, k in self._members.items() if now - k[0] < self.members_ttl}
        for index, groups in by_host.items():
            pipe = self._client(index).pipeline(transaction=False)
            expired = int(time.time()) - self.group_expiry
            for _, group in groups:
                key = self._group_key(group)
                pipe.zremrangebyscore(key, min=0, max=expired)
                pipe.zrange(key, 0, -1)
            replies = pipe.execute()
            for (position, group), names in zip(groups, replies[1::2], strict=True):
                names_of[position] = [name.decode("utf8") for name in names]
                if fresh:
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
