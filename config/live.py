"""Live delivery of run traces. THE one module that owns group names and publishing.

Events are published after their step committed, one group message per step (a batch),
from one long-lived event loop per process (no event loop per event), which sends the batches
in order while the committing thread goes on (it never waits for the channel layer). Delivery is
best-effort by design: a dropped message (a full channel layer) is healed by the
consumer, which backfills from the database whenever it sees a gap in ``seq``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_SECONDS = 5.0


def run_group(run_id: Any) -> str:
    return f"run.{getattr(run_id, 'hex', str(run_id).replace('-', ''))}"


def tenant_runs_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}.runs"


def tenant_approvals_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}.approvals"


class _Publisher:
    """One event loop thread per process that sends queued batches to the channel layer, in submission order.

    ``submit`` hands a batch over and returns at once: the worker thread that committed a step never waits
    for the channel layer (Redis). Batches are sent one at a time, in the order they were submitted, so a
    run's steps reach the layer in commit order. A batch that fails or takes longer than
    ``PUBLISH_TIMEOUT_SECONDS`` is logged and dropped, and when more than ``MAX_QUEUED`` batches wait (the
    layer is down) new ones are dropped: the events are committed, and viewers backfill from the database
    whenever they see a gap in ``seq``.
    """

    MAX_QUEUED = 10_000

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Callable[[], Awaitable[Any]]] | None = None
        self._lock = threading.Lock()
        self._pid = 0

    def _ensure_loop(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue[Callable[[], Awaitable[Any]]]]:
        with self._lock:
            # A forked child inherits the loop object but not its thread: it starts its own.
            if self._loop is None or self._loop.is_closed() or self._queue is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                queue: asyncio.Queue[Callable[[], Awaitable[Any]]] = asyncio.Queue(maxsize=self.MAX_QUEUED)
                thread = threading.Thread(target=loop.run_forever, name="agentops-publisher", daemon=True)
                thread.start()
                asyncio.run_coroutine_threadsafe(self._drain(queue), loop)
                self._loop, self._queue, self._pid = loop, queue, os.getpid()
            return self._loop, self._queue

    @staticmethod
    async def _drain(queue: asyncio.Queue[Callable[[], Awaitable[Any]]]) -> None:
        while True:
            send = await queue.get()
            try:
                await asyncio.wait_for(send(), PUBLISH_TIMEOUT_SECONDS)
            except Exception:
                log.warning("live publish failed; websocket clients will backfill from the database", exc_info=True)
            finally:
                queue.task_done()

    def submit(self, send: Callable[[], Awaitable[Any]], on_drop: Callable[[], None] | None = None) -> None:
        """Queue ``send`` (an async callable) to run on the publisher's loop after the batches before it;
        ``on_drop`` is called instead when the queue is full."""
        loop, queue = self._ensure_loop()

        def enqueue() -> None:
            try:
                queue.put_nowait(send)
            except asyncio.QueueFull:
                log.warning("live publish queue full (%d batches); dropped one, clients will backfill", self.MAX_QUEUED)
                if on_drop is not None:
                    on_drop()

        loop.call_soon_threadsafe(enqueue)

    def flush(self, timeout: float = PUBLISH_TIMEOUT_SECONDS) -> bool:
        """Wait until every batch submitted before this call was sent (or dropped). For tests and shutdown."""
        done = threading.Event()

        async def mark() -> None:
            done.set()

        self.submit(mark)
        return done.wait(timeout)


_publisher = _Publisher()


def flush(timeout: float = PUBLISH_TIMEOUT_SECONDS) -> bool:
    """Block until the batches published so far have been handed to the channel layer (True), or ``timeout``."""
    return _publisher.flush(timeout)


def _send(groups_and_messages: list[tuple[str, dict[str, Any]]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return

    async def send_all() -> None:
        for group, message in groups_and_messages:
            await layer.group_send(group, message)

    _publisher.submit(send_all)


def encode_frame(frame: dict[str, Any]) -> str:
    """A frame's websocket text, exactly as ``AsyncJsonWebsocketConsumer.send_json`` would encode it."""
    return json.dumps(frame)


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
        ]
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

    async def send() -> None:
        try:
            await layer.group_send(group, message)
        finally:
            done()

    _publisher.submit(send, on_drop=done)
    return True


def publish_approval(*, tenant_id: int, summary: dict[str, Any]) -> None:
    """Tell the tenant's approver pages that a request arrived or was decided."""
    _send([(tenant_approvals_group(tenant_id), {"type": "approval.changed", "approval": summary})])
