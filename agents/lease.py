"""Keeping a run's lease alive while one step takes long (a slow model or tool call).

The lease is renewed at every step commit; a heartbeat thread also renews it every third of
``RUN_LEASE_SECONDS`` while the worker is alive, so a long step is not mistaken for a dead
worker. A worker that dies takes its heartbeat with it, and the lease then expires as before.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
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
    """Calls ``renew`` every ``interval`` seconds while the ``with`` block runs, until the lease is lost (``renew``
    returns False). All heartbeats of a process share one thread (:class:`_Beats`): a step or a flow node costs a
    registration, not a thread started and joined. Leaving the block waits for a renewal in progress, so none
    happens after it."""

    def __init__(self, renew: Callable[[], bool], interval: float) -> None:
        self.renew = renew
        self.interval = interval
        self.beats = 0

    def __enter__(self) -> LeaseHeartbeat:
        _beats().add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _beats().remove(self)


class _Beats:
    """The process's heartbeat thread: renews each registered lease when it is due, one at a time, with its own
    database connection, returned to the pool after each beat. A renewal is one short UPDATE of a row that only
    short transactions lock (a step's or a node's commit), so one beat does not hold the others back for long; a
    beat runs late rather than twice, and each lease is renewed every third of its length, so a late one is not
    a lost one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, LeaseHeartbeat]] = {}
        self._running: LeaseHeartbeat | None = None
        self._thread = threading.Thread(target=self._loop, name="lease-heartbeats", daemon=True)
        self._thread.start()

    def add(self, beat: LeaseHeartbeat) -> None:
        with self._cond:
            self._due[id(beat)] = (time.monotonic() + beat.interval, beat)
            self._cond.notify_all()

    def remove(self, beat: LeaseHeartbeat) -> None:
        with self._cond:
            self._due.pop(id(beat), None)
            while self._running is beat:
                self._cond.wait()

    def _next(self) -> LeaseHeartbeat:
        with self._cond:
            while True:
                if not self._due:
                    self._cond.wait()
                    continue
                key, (when, beat) = min(self._due.items(), key=lambda item: item[1][0])
                wait = when - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                self._due[key] = (time.monotonic() + beat.interval, beat)
                self._running = beat
                return beat

    def _loop(self) -> None:
        while True:
            beat = self._next()
            alive = True
            try:
                alive = bool(beat.renew())
                if alive:
                    beat.beats += 1
            except Exception:  # a transient database error: the next beat tries again
                log.warning("could not renew a lease", exc_info=True)
            finally:
                connection.close()  # this thread's own connection: back to the pool between beats
                with self._cond:
                    if not alive:  # lost or finished: nothing left to keep alive
                        self._due.pop(id(beat), None)
                    self._running = None
                    self._cond.notify_all()


_shared: tuple[int, _Beats] | None = None
_shared_lock = threading.Lock()


def _beats() -> _Beats:
    """The process's heartbeat thread, started on first use (again in a forked child: threads do not survive fork)."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid():
            _shared = (os.getpid(), _Beats())
        return _shared[1]


def heartbeat_for(run_id: Any, token: str) -> LeaseHeartbeat:
    return LeaseHeartbeat(lambda: renew_lease(run_id, token), interval=max(1.0, settings.RUN_LEASE_SECONDS / 3))
