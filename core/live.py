"""Live delivery of run traces. THE one module that owns group names and publishing.

Events are published after their step committed, one group message per step (a batch),
from one long-lived thread per process (no event loop per event), which sends the batches
in order while the committing thread goes on (it never waits for the channel layer). Delivery is
best-effort by design: a dropped message (a full channel layer) is healed by the
consumer, which backfills from the database whenever it sees a gap in ``seq``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from channels.layers import get_channel_layer

from core import fastjson, redis_layer

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_SECONDS = 5.0


def run_group(run_id: Any) -> str:
    return f"run.{getattr(run_id, 'hex', str(run_id).replace('-', ''))}"


def tenant_runs_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}.runs"


def tenant_approvals_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}.approvals"


class _Publisher:
    """One thread per process that sends queued batches to the channel layer, in submission order.

    ``submit`` hands a batch over and returns at once: the worker thread that committed a step never waits
    for the channel layer (Redis). Batches are sent one at a time, in the order they were submitted, so a
    run's steps reach the layer in commit order. A batch that fails or takes longer than
    ``PUBLISH_TIMEOUT_SECONDS`` is logged and dropped, and when more than ``MAX_QUEUED`` batches wait (the
    layer is down) new ones are dropped: the events are committed, and viewers backfill from the database
    whenever they see a gap in ``seq``.

    A batch is a plain callable (it may ask the watched-groups registry, core/redis_layer.py, with its
    synchronous client) that may return a coroutine (the channel layer's public ``group_send`` for each group
    someone watches), which runs on the thread's own event loop, the same one for the thread's life (channels_redis
    keeps a connection pool per event loop: the publisher's is made once).
    """

    MAX_QUEUED = 10_000

    def __init__(self) -> None:
        self._queue: queue.Queue[Callable[[], Any]] | None = None
        self._lock = threading.Lock()
        self._pid = 0

    def _ensure_thread(self) -> queue.Queue[Callable[[], Any]]:
        with self._lock:
            # A forked child inherits the queue object but not its thread: it starts its own.
            if self._queue is None or self._pid != os.getpid():
                batches: queue.Queue[Callable[[], Any]] = queue.Queue(maxsize=self.MAX_QUEUED)
                threading.Thread(target=self._drain, args=(batches,), name="agentops-publisher", daemon=True).start()
                self._queue, self._pid = batches, os.getpid()
            return self._queue

    @staticmethod
    def _drain(batches: queue.Queue[Callable[[], Any]]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        while True:
            send = batches.get()
            try:
                sent = send()
                if inspect.isawaitable(sent):
                    loop.run_until_complete(asyncio.wait_for(sent, PUBLISH_TIMEOUT_SECONDS))
            except Exception:
                log.warning("live publish failed; websocket clients will backfill from the database", exc_info=True)

    def submit(self, send: Callable[[], Any], on_drop: Callable[[], None] | None = None) -> None:
        """Queue ``send`` (a callable, or an async one) to run on the publisher's thread after the batches before
        it; ``on_drop`` is called instead when the queue is full."""
        batches = self._ensure_thread()
        try:
            batches.put_nowait(send)
        except queue.Full:
            log.warning("live publish queue full (%d batches); dropped one, clients will backfill", self.MAX_QUEUED)
            if on_drop is not None:
                on_drop()

    def flush(self, timeout: float = PUBLISH_TIMEOUT_SECONDS) -> bool:
        """Wait until every batch submitted before this call was sent (or dropped). For tests and shutdown."""
        done = threading.Event()
        self.submit(done.set)
        return done.wait(timeout)


_publisher = _Publisher()


def flush(timeout: float = PUBLISH_TIMEOUT_SECONDS) -> bool:
    """Block until the batches published so far have been handed to the channel layer (True), or ``timeout``."""
    return _publisher.flush(timeout)


#: Watchers read the database once more this long after the registry's ttl, for what was sent while they joined.
RESYNC_MARGIN_SECONDS = 0.25


def resync_after() -> float | None:
    """Seconds after joining a run's group (or the tenant's run list) when a watcher reads the database once more:
    the publisher may use who watches as read up to ``LIVE_MEMBERS_TTL_SECONDS`` before a send
    (core/redis_layer.py), so a watcher that joined in between was not sent what was committed until then. None:
    every send asks (no registry, or a ttl of 0: no resync)."""
    watched = redis_layer.registry()
    ttl = watched.ttl if watched is not None else 0.0
    return ttl + RESYNC_MARGIN_SECONDS if ttl > 0 else None


def refresh_every(layer: Any) -> float:
    """How often a holder of a group membership renews it (a third of the layer's ``group_expiry``)."""
    return max(1.0, float(getattr(layer, "group_expiry", 86400)) / 3)


async def join_group(layer: Any, group: str, channel: str) -> None:
    """Add ``channel`` to ``group`` (the layer's ``group_add``) and record that it watches the group
    (core/redis_layer.py ``watch``: every publisher is told). On failure the membership is given back."""
    await layer.group_add(group, channel)
    watched = redis_layer.registry()
    if watched is None:
        return
    try:
        await asyncio.to_thread(watched.watch, group, channel)
    except BaseException:
        with contextlib.suppress(Exception):
            await layer.group_discard(group, channel)
        raise


async def leave_group(layer: Any, group: str, channel: str) -> None:
    """Take ``channel`` out of ``group`` and out of the registry (both expire on their own if this fails)."""
    watched = redis_layer.registry()
    try:
        if watched is not None:
            await asyncio.to_thread(watched.unwatch, group, channel)
    finally:
        await layer.group_discard(group, channel)


async def refresh_membership(layer: Any, group: str, channel: str) -> None:
    """Renew ``channel``'s membership of ``group`` (the layer's ``group_add``: its join time set to now) and its entry
    in the registry (unannounced: a watcher renewed is not a new one)."""
    await layer.group_add(group, channel)
    watched = redis_layer.registry()
    if watched is not None:
        await asyncio.to_thread(watched.renew, group, channel)


async def _group_send_all(layer: Any, groups_and_messages: list[tuple[str, dict[str, Any]]]) -> None:
    for group, message in groups_and_messages:
        await layer.group_send(group, message)


def _watched_only(watched: redis_layer.WatchedGroups | None,
                  groups_and_messages: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """(On the publisher's thread.) The pairs whose group someone watches; all of them without a registry."""
    if watched is None:
        return groups_and_messages
    names = watched.watched([group for group, _ in groups_and_messages])
    return [(group, message) for group, message in groups_and_messages if group in names]


def _send(groups_and_messages: list[tuple[str, dict[str, Any]]], *, cached: bool = False) -> None:
    """``cached``: the groups' watchers resync (:func:`resync_after`), so who watches may be as read a moment ago and a
    group nobody watches is skipped; otherwise every group is sent to."""
    layer = get_channel_layer()
    if layer is None:
        return
    watched = redis_layer.registry() if cached else None

    def send() -> Any:
        pairs = _watched_only(watched, groups_and_messages)
        return _group_send_all(layer, pairs) if pairs else None

    _publisher.submit(send)


def unwatched(run_id: Any, tenant_id: int) -> bool:
    """Whether a step's publish would reach nobody, as this process knows already without asking Redis (nobody
    watches the run nor the tenant's run list: core/redis_layer.py ``nobody_in``); False whenever it does not know.
    Then the step is not framed at all: a watcher who joined meanwhile gets it from the database (``resync_after``)."""
    watched = redis_layer.registry()
    return watched is not None and watched.nobody_in((run_group(run_id), tenant_runs_group(tenant_id)))


def encode_frame(frame: dict[str, Any]) -> str:
    """A frame's websocket text: compact JSON (core/fastjson.py), as the trace socket and the event stream send it."""
    return fastjson.dumps(frame)


def publish_run_events(*, run_id: Any, tenant_id: int, frames: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """Send a committed step's event frames to the run's watchers and its summary to the tenant's run list.

    Each frame travels with its text (``texts``, in the same order), encoded once here: every watcher of the
    run sends that text as it is, instead of each of them encoding the same frame again.
    """
    if not frames:
        return
    _send(
        [
            (run_group(run_id), {"type": "run.events", "events": frames, "texts": [encode_frame(f) for f in frames]}),
            (tenant_runs_group(tenant_id), {"type": "run.summary", "run": summary}),
        ],
        cached=True,  # both kinds of watchers resync (agents/consumers.py, agents/sse.py, console/consumers.py)
    )


MAX_DELTAS_QUEUED = 500  # deltas waiting in this process's publisher; past this, new ones are dropped
_deltas_queued = 0
_deltas_lock = threading.Lock()


def publish_run_delta(*, run_id: Any, frame: dict[str, Any]) -> bool:
    """Send an ephemeral ``message.delta`` frame to the run's watchers; False when it was dropped.

    Deltas are best-effort and never stored: when the channel layer is slow and deltas pile up in the
    publisher, new ones are dropped here, so they can never crowd out the committed steps' batches (which
    viewers would have to backfill) nor grow the worker's memory. The worker thread never waits.
    """
    global _deltas_queued
    layer = get_channel_layer()
    if layer is None:
        return False
    with _deltas_lock:
        if _deltas_queued >= MAX_DELTAS_QUEUED:
            return False
        _deltas_queued += 1
    message = {"type": "run.delta", "frame": frame, "text": encode_frame(frame)}
    group = run_group(run_id)

    def done() -> None:
        global _deltas_queued
        with _deltas_lock:
            _deltas_queued -= 1

    watched = redis_layer.registry()

    def send() -> Any:
        try:
            pairs = _watched_only(watched, [(group, message)])  # deltas are ephemeral: one missed is not resent
        except BaseException:
            done()
            raise
        if not pairs:
            done()
            return None

        async def send_async() -> None:
            try:
                await _group_send_all(layer, pairs)
            finally:
                done()

        return send_async()

    _publisher.submit(send, on_drop=done)
    return True


def publish_approval(*, tenant_id: int, summary: dict[str, Any]) -> None:
    """Tell the tenant's approver pages that a request arrived or was decided."""
    _send([(tenant_approvals_group(tenant_id), {"type": "approval.changed", "approval": summary})])
