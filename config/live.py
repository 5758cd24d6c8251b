"""Live delivery of run traces. THE one module that owns group names and publishing.

Events are published after their step committed, one group message per step (a batch),
from one long-lived event loop per process (no event loop per event). Delivery is
best-effort by design: a dropped message (a full channel layer) is healed by the
consumer, which backfills from the database whenever it sees a gap in ``seq``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Coroutine
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
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="agentops-publisher", daemon=True)
                thread.start()
                self._loop = loop
            return self._loop

    def submit(self, coro: Coroutine[Any, Any, Any]) -> None:
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())
        try:
            future.result(timeout=PUBLISH_TIMEOUT_SECONDS)
        except Exception:
            log.warning("live publish failed; websocket clients will backfill from the database", exc_info=True)


_publisher = _Publisher()


def _send(groups_and_messages: list[tuple[str, dict[str, Any]]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return

    async def send_all() -> None:
        for group, message in groups_and_messages:
            await layer.group_send(group, message)

    _publisher.submit(send_all())


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


def publish_approval(*, tenant_id: int, summary: dict[str, Any]) -> None:
    """Tell the tenant's approver pages that a request arrived or was decided."""
    _send([(tenant_approvals_group(tenant_id), {"type": "approval.changed", "approval": summary})])
