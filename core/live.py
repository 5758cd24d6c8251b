"""Live delivery of run traces. THE one module that owns group names and publishing.

Events are published after their step committed, one group message per step (a batch),
from one long-lived thread per process (no event loop per event), which sends the batches
in order while the committing thread goes on (it never waits for the channel layer). Delivery is
best-effort by design: a dropped message (a full channel layer) is healed by the
consumer, which backfills from the database whenever it sees a gap in ``seq``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from channels.layers import get_channel_layer

from core import fastjson

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

    A batch is a plain callable (the Redis layer's synchronous ``send_groups``, core/redis_layer.py: no event
    loop between the committing thread and Redis) or one returning a coroutine (any other layer), which runs on
    the thread's own event loop, the same one for the thread's life.
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


#: Watchers read the database once more this long after their members_ttl, for what was sent while they joined.
RESYNC_MARGIN_SECONDS = 0.25


def resync_after() -> float | None:
    """Seconds after joining a run's group (or the tenant's run list) when a watcher reads the database once more:
    the publisher may use members read up to ``members_ttl`` before a send (core/redis_layer.py), so a watcher that
    joined in between was not sent what was committed until then. None: every send reads the members (no resync)."""
    ttl = float(getattr(get_channel_layer(), "members_ttl", 0.0) or 0.0)
    return ttl + RESYNC_MARGIN_SECONDS if ttl > 0 else None


def refresh_every(layer: Any) -> float:
    """How often a holder of a group membership renews it (a third of the layer's ``group_expiry``)."""
    return max(1.0, float(getattr(layer, "group_expiry", 86400)) / 3)


async def refresh_membership(layer: Any, group: str, channel: str) -> None:
    """Renew ``channel``'s membership of ``group`` (core/redis_layer.py ``group_refresh``; ``group_add`` elsewhere)."""
    refresh = getattr(layer, "group_refresh", None) or layer.group_add
    await refresh(group, channel)


def _send(groups_and_messages: list[tuple[str, dict[str, Any]]], *, cached: bool = False) -> None:
    """``cached``: the groups' watchers resync (:func:`resync_after`), so their members may be read as of a moment ago."""
    layer = get_channel_layer()
    if layer is None:
        return

    send_groups = getattr(layer, "send_groups", None)
    if send_groups is not None:  # core/redis_layer.py: one synchronous pipeline for all the groups
        _publisher.submit(lambda: send_groups(groups_and_messages, cached=cached))
        return

    async def send_all() -> None:
        for group, message in groups_and_messages:
            await layer.group_send(group, message)

    _publisher.submit(send_all)


def unwatched(run_id: Any, tenant_id: int) -> bool:
    """Whether a step's publish would reach nobody, as the layer knows already without asking Redis (nobody watches
    the run nor the tenant's run list: core/redis_layer.py ``nobody_in``); False whenever it does not know. Then the
    step is not framed at all: a watcher who joined meanwhile gets it from the database (``resync_after``)."""
    nobody_in = getattr(get_channel_layer(), "nobody_in", None)
    return bool(nobody_in is not None and nobody_in((run_group(run_id), tenant_runs_group(tenant_id))))


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

    send_groups = getattr(layer, "send_groups", None)

    def send() -> Any:
        if send_groups is not None:
            try:
                send_groups([(group, message)], cached=True)  # deltas are ephemeral: one missed is not resent
            finally:
                done()
            return None

        async def send_async() -> None:
            try:
                await layer.group_send(group, message)
            finally:
                done()

        return send_async()

    _publisher.submit(send, on_drop=done)
    return True


def publish_approval(*, tenant_id: int, summary: dict[str, Any]) -> None:
    """Tell the tenant's approver pages that a request arrived or was decided."""
    _send([(tenant_approvals_group(tenant_id), {"type": "approval.changed", "approval": summary})])
