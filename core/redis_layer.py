"""Who watches a live group: a registry of our own in Redis, so a step nobody watches is neither framed nor sent.

The channel layer is channels_redis's, as shipped (settings ``CHANNEL_LAYERS``), and the publisher thread sends with
its public ``group_send`` (core/live.py). A run's trace has nobody watching most of the time, and ``group_send``
takes two round trips to find that out; framing the step costs the committing thread more. So the watchers say where
they are, in keys of ours (channels_redis's own keys are its business):

- A server process that starts watching a group (a run's feed, agents/run_feeds.py: one channel-layer membership per
  watched run per process; a run-list or approvals socket, tenants/feeds.py) records it with :meth:`WatchedGroups.watch`
  in the sorted set ``<prefix>:watched:<group>`` (member: the channel it joined with; score: when it joined or last
  renewed, ``time.time()``), and PUBLISHes the group on ``<prefix>:watched-joined``. It renews the entry with its
  channel-layer membership (:meth:`~WatchedGroups.renew`, every third of ``expiry``) and removes it when it leaves
  (:meth:`~WatchedGroups.unwatch`). An entry older than ``expiry`` (a killed process's) does not count, and the key
  itself expires ``expiry`` after its last join or renewal.
- The publisher asks :meth:`~WatchedGroups.watched` which of a step's groups someone watches (one pipeline, one round
  trip) and remembers each answer for ``ttl`` seconds (``LIVE_MEMBERS_TTL_SECONDS``): with nobody watching, a step
  costs no round trip at all, and :meth:`~WatchedGroups.nobody_in` tells the committing thread so before it frames
  anything. A listener thread per process forgets a group's answer as soon as it hears a join announced, so a new
  watcher gets the next step live; while the listener is not subscribed (starting, Redis down, reconnecting) nothing
  is remembered, and an answer read while an announcement was heard is not kept.
- A join whose word is lost all the same (or one that raced a read) may miss what is sent until the answer is read
  again: the watchers of those groups read the database once more that long after joining
  (``core.live.resync_after``), so every committed event still reaches them, in order, once. Groups whose watchers
  do not resync (approvals) are sent without asking (``cached=False`` in core/live.py).

Embedded mode (``LIVE_WATCHED`` None: the in-memory layer, core/channel_layers.py) has no registry: every step is
framed and sent, which costs no round trip there.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

log = logging.getLogger(__name__)

#: Answers remembered per process at most (one per recently published run and tenant); past it, stale ones go.
MAX_REMEMBERED = 1000


class WatchedGroups:
    """The registry of watched groups on one Redis (``url``), under ``prefix``. Safe to share between threads; a forked
    child starts with no client, listener or remembered answer of its parent's."""

    def __init__(self, url: str, *, prefix: str = "agentops", ttl: float = 1.0, expiry: float = 300.0,
                 socket_timeout: float = 5.0, socket_connect_timeout: float = 5.0) -> None:
        self.url = url
        self.prefix = prefix
        self.ttl = max(0.0, float(ttl))
        self.expiry = max(1.0, float(expiry))
        self.socket_timeout = float(socket_timeout)
        self.socket_connect_timeout = float(socket_connect_timeout)
        self._lock = threading.Lock()
        self._pid = 0
        self._redis: Any = None
        self._listener = False  # a listener thread was started in this process
        self._listening = False  # ... and is subscribed now: only then is an answer remembered
        self._known: dict[str, tuple[float, bool]] = {}  # group -> (when read, monotonic; someone watches)
        self._epoch = 0  # counts what the listener heard: a read that overlapped any of it is not remembered
        self._epochs = itertools.count(1)

    @property
    def joins_channel(self) -> str:
        """Where every :meth:`watch` says which group gained a watcher (Redis pub/sub)."""
        return f"{self.prefix}:watched-joined"

    def key(self, group: str) -> str:
        return f"{self.prefix}:watched:{group}"

    def _this_process(self) -> None:
        """(Under the lock.) A forked child forgets its parent's client, listener and answers."""
        if self._pid != os.getpid():
            self._pid, self._redis, self._listener, self._listening, self._known = os.getpid(), None, False, False, {}

    def client(self) -> Any:
        """This process's synchronous redis-py client (thread-safe: one connection pool)."""
        with self._lock:
            self._this_process()
            if self._redis is None:
                import redis  # here: importing redis loads the OpenTelemetry SDK, and settings import this module's users

                self._redis = redis.Redis.from_url(self.url, socket_timeout=self.socket_timeout,
                                                   socket_connect_timeout=self.socket_connect_timeout,
                                                   socket_keepalive=True, health_check_interval=30)
            return self._redis

    # -- the watchers' side (a server process; async callers run these in a thread: core/live.py) ----------------

    def _record(self, group: str, member: str, *, announce: bool) -> None:
        now = time.time()
        key = self.key(group)
        pipe = self.client().pipeline(transaction=False)
        pipe.zadd(key, {member: now})
        pipe.zremrangebyscore(key, "-inf", now - self.expiry)  # a killed process's entry, never renewed
        pipe.expire(key, math.ceil(self.expiry))
        if announce:
            pipe.publish(self.joins_channel, group)
        pipe.execute()

    def watch(self, group: str, member: str) -> None:
        """``member`` (the channel that joined ``group``) watches it from now on; every publisher is told at once."""
        self._record(group, member, announce=True)

    def renew(self, group: str, member: str) -> None:
        """``member`` still watches ``group`` (unannounced: publishers keep what they remember)."""
        self._record(group, member, announce=False)

    def unwatch(self, group: str, member: str) -> None:
        """``member`` left ``group`` (a publisher that remembers it watched sends to the group a while longer: harmless)."""
        self.client().zrem(self.key(group), member)

    # -- the publisher's side -----------------------------------------------------------------------------------

    def _subscribed(self) -> bool:
        """Whether this process's listener is subscribed (starting it the first time): only then is an answer kept."""
        if self._listener and self._pid == os.getpid():
            return self._listening
        with self._lock:
            self._this_process()
            if not self._listener:
                self._listener = True
                threading.Thread(target=_listen, args=(weakref.ref(self), os.getpid()), name="agentops-watched",
                                 daemon=True).start()
            return self._listening

    def watched(self, groups: Sequence[str]) -> set[str]:
        """Which of ``groups`` someone watches: the answers read less than ``ttl`` ago, the others read now, in one
        round trip (none when every answer is remembered)."""
        now = time.monotonic()
        remember = self.ttl > 0 and self._subscribed()
        epoch = self._epoch
        found: set[str] = set()
        unknown: list[str] = []
        for group in dict.fromkeys(groups):
            known = self._known.get(group) if remember else None
            if known is not None and now - known[0] < self.ttl:
                if known[1]:
                    found.add(group)
            else:
                unknown.append(group)
        if not unknown:
            return found
        oldest = time.time() - self.expiry
        pipe = self.client().pipeline(transaction=False)
        for group in unknown:
            pipe.zcount(self.key(group), f"({oldest!r}", "+inf")
        counts = pipe.execute()
        found.update(group for group, count in zip(unknown, counts, strict=True) if count)
        if remember and self._listening and self._epoch == epoch:
            known_now = self._known
            if len(known_now) >= MAX_REMEMBERED:
                # list(): one step under the GIL, so the listener's pop cannot change the dict while it is read
                known_now = self._known = {g: k for g, k in list(known_now.items()) if now - k[0] < self.ttl}
            for group, count in zip(unknown, counts, strict=True):
                known_now[group] = (now, bool(count))
            if self._epoch != epoch or not self._listening:  # the listener heard something meanwhile: not kept
                for group in unknown:
                    known_now.pop(group, None)
        return found

    def nobody_in(self, groups: Iterable[str]) -> bool:
        """Whether :meth:`watched` would say that nobody watches any of ``groups``, by what is remembered now (never
        asking Redis): each answer read less than ``ttl`` ago, "nobody", and the listener subscribed. A caller that
        gets True may skip preparing the messages at all."""
        if self.ttl <= 0 or not self._listening or self._pid != os.getpid():
            return False
        now = time.monotonic()
        for group in groups:
            known = self._known.get(group)
            if known is None or known[1] or now - known[0] >= self.ttl:
                return False
        return True

    def forget(self) -> None:
        """Drop every remembered answer (tests; the listener does it at each (re)subscription)."""
        self._epoch = next(self._epochs)
        self._known = {}


def _listen(ref: weakref.ref[WatchedGroups], pid: int) -> None:
    """A registry's listener: forgets a group's remembered answer as soon as a :meth:`WatchedGroups.watch` anywhere
    announces a new watcher. While not subscribed (Redis down, reconnecting) nothing is remembered: every send asks.
    It holds the registry weakly and ends with it (or in a forked child, which starts its own)."""
    backoff = 0.5
    while True:
        registry = ref()
        if registry is None or registry._pid != pid:
            return
        pubsub = None
        try:
            pubsub = registry.client().pubsub()
            pubsub.subscribe(registry.joins_channel)
            while registry is not None and registry._pid == pid:
                message = pubsub.get_message(timeout=1.0)
                if message is not None and message["type"] == "subscribe":
                    registry.forget()  # what was remembered unheard (and any read begun before this) is not trusted
                    registry._listening = True
                    backoff = 0.5
                elif message is not None and message["type"] == "message":
                    registry._epoch = next(registry._epochs)
                    registry._known.pop(message["data"].decode("utf8", "replace"), None)
                registry = None  # held weakly between messages: a registry dropped by its process ends its listener
                registry = ref()
        except Exception:
            log.info("watched-groups listener stopped; asking Redis at every send until it is back", exc_info=True)
        finally:
            registry = ref()
            if registry is not None and registry._pid == pid:
                registry._listening = False
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    pubsub.close()
        if registry is None:
            return
        del registry
        time.sleep(backoff)
        backoff = min(backoff * 2, 10.0)


_registry: tuple[Any, WatchedGroups] | None = None
_registry_lock = threading.Lock()


def registry() -> WatchedGroups | None:
    """The process's registry, as ``settings.LIVE_WATCHED`` configures it (keyword arguments of :class:`WatchedGroups`);
    None when it is unset (embedded mode): then every group is sent to, unasked."""
    global _registry
    from django.conf import settings

    config = getattr(settings, "LIVE_WATCHED", None)
    current = _registry
    if current is not None and current[0] is config:
        return current[1]
    if not config:
        return None
    with _registry_lock:
        if _registry is None or _registry[0] is not config:
            _registry = (config, WatchedGroups(**config))
        return _registry[1]
