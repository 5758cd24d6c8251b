"""Keeping a run's lease alive while one step takes long (a slow model or tool call).

The lease is renewed at every step commit; a heartbeat thread also renews it every third of
``RUN_LEASE_SECONDS`` while the worker is alive, so a long step is not mistaken for a dead
worker. A worker that dies takes its heartbeat with it, and the lease then expires as before.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

log = logging.getLogger(__name__)


def renew_lease(run_id: Any, token: str) -> bool:
    """Extend the lease if this worker still holds it; False when it was lost (or the run finished)."""
    from agents.models import Run

    expires = timezone.now() + dt.timedelta(seconds=settings.RUN_LEASE_SECONDS)
    return bool(Run.objects.filter(pk=run_id, lease_token=token).update(lease_expires_at=expires))


class LeaseHeartbeat:
    """Calls ``renew`` every ``interval`` seconds in a daemon thread until stopped or the lease is lost."""

    def __init__(self, renew: Callable[[], bool], interval: float) -> None:
        self.renew = renew
        self.interval = interval
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> LeaseHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    if not self.renew():
                        return  # lost or finished: nothing left to keep alive
                    self.beats += 1
                except Exception:  # a transient database error: the next beat tries again
                    log.warning("could not renew a run lease", exc_info=True)
                finally:
                    connection.close()  # this thread's own connection: back to the pool between beats
        finally:
            connection.close()


def heartbeat_for(run_id: Any, token: str) -> LeaseHeartbeat:
    return LeaseHeartbeat(lambda: renew_lease(run_id, token), interval=max(1.0, settings.RUN_LEASE_SECONDS / 3))
