"""Where tool calls run: on worker threads, inside their tool's bulkhead, until they really end.

A bulkhead lets at most :func:`size` calls of one tool (per tenant) run at once in a
process (the setting ``TOOL_BULKHEAD_SIZE``, default 4). A call holds its slot until its thread is done with it, *past its timeout too*: the
gateway stops waiting at the timeout and sets the call's cancel signal (:mod:`tools.cancel`),
but a thread cannot be stopped from outside, so a call that ignores the signal keeps its slot
(and counts in ``agentops_tool_calls_overrunning``) until it returns. Hence:

- a tool that hangs holds at most :func:`size` threads; every other tool keeps running:
  calls run on daemon threads that are reused when idle and started when none is (:class:`Workers`),
  not on a fixed pool that hung calls could fill;
- when every slot of a tool is held by calls past their timeout, a new call is refused at once
  (:class:`BulkheadFull`, reason ``"overrunning"``) instead of queueing behind them; when the
  slots are held by calls still within their time, a new call waits for one at most its own
  timeout (reason ``"busy"`` after that).

HTTP tools end at their deadline by themselves (:mod:`tools.http_exec`), process-isolated Python
tools are killed at it (:mod:`tools.isolation`), and cooperative Python tools stop when they see
the signal; only a Python function that never checks can overrun for long.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from django.conf import settings
from django.db import connections

from tools.cancel import cancel_scope
from tools.metrics import TOOL_OVERRUNNING, TOOL_OVERRUNS

__all__ = ["BULKHEAD_SIZE", "Bulkhead", "BulkheadFull", "Slot", "Workers", "admit", "size"]

#: At most this many calls of one tool (per tenant) run at once in a process; ``None``: the setting
#: ``TOOL_BULKHEAD_SIZE`` (tests set a number here).
BULKHEAD_SIZE: int | None = None


def size() -> int:
    return BULKHEAD_SIZE or int(settings.TOOL_BULKHEAD_SIZE)

#: A worker thread idle this long ends. (It returns its database connection after every call.)
IDLE_SECONDS = 60.0


class Workers:
    """Daemon threads for tool calls: an idle one takes the next call, else a new one starts.

    There is no upper bound here on purpose: the bulkheads bound the calls of each tool, and a
    thread held by a hung call must never make another tool's call wait. Daemon threads also let
    the process exit while a hung call runs on.
    """

    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self.idle_seconds = idle_seconds
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a task that no queued task has claimed yet

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            self._tasks.put(task)
            if self._idle:
                self._idle -= 1
                return
        threading.Thread(target=self._loop, name="tool-call", daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                task = self._tasks.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._tasks.empty():  # no queued task counts on this thread
                        self._idle -= 1
                        break
                continue
            try:
                task()
            finally:
                connections.close_all()  # hand a pooled connection back now, not when this thread ends
            with self._lock:
                self._idle += 1


_workers = Workers()


class BulkheadFull(Exception):
    """No slot: ``reason`` is ``"overrunning"`` (every slot held by a call past its timeout) or ``"busy"``."""

    def __init__(self, reason: str, running: int, overrunning: int) -> None:
        super().__init__(f"bulkhead full ({reason}): {running} running, {overrunning} past their timeout")
        self.reason = reason
        self.running = running
        self.overrunning = overrunning

    def model_message(self, tool: str, timeout: float) -> str:
        if self.reason == "overrunning":
            return (
                f"The tool {tool} is not answering: its last {self.overrunning} calls are still running past their "
                f"{timeout:g} s limit, so it was not called this time. Do not retry it now; tell the user it is "
                "unavailable for the moment."
            )
        return (
            f"The tool {tool} is busy ({self.running} calls of it are running) and was not called. "
            "Try again a little later, or tell the user it is busy."
        )


class Bulkhead:
    """The slots of one tool in this process."""

    def __init__(self, size: int, label: str) -> None:
        self.size = size
        self.label = label
        self.running = 0  # calls holding a slot
        self.overrunning = 0  # of which, past their timeout
        self._cond = threading.Condition()

    def acquire(self, wait: float) -> Slot:
        """A slot, waiting at most ``wait`` s for one; raises :class:`BulkheadFull`."""
        deadline = time.monotonic() + wait
        with self._cond:
            while self.running >= self.size:
                left = deadline - time.monotonic()
                if self.overrunning >= self.size or left <= 0:
                    reason = "overrunning" if self.overrunning >= self.size else "busy"
                    raise BulkheadFull(reason, self.running, self.overrunning)
                self._cond.wait(left)
            self.running += 1
        return Slot(self)


class Slot:
    """One call's place in its bulkhead, held until the call's thread ends (:meth:`run`)."""

    def __init__(self, bulkhead: Bulkhead) -> None:
        self.bulkhead = bulkhead
        #: The call's cancel signal, set by :meth:`overran` (executors see it as ``ctx.cancel``).
        self.cancel = threading.Event()
        self._ended = False
        self._overrunning = False

    def run(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Start ``fn(*args)`` on a worker thread; the slot is released when it returns or raises."""
        future: Future[Any] = Future()
        try:
            _workers.submit(lambda: self._work(future, fn, args))
        except BaseException:
            self._release()
            raise
        return future

    def overran(self) -> None:
        """The caller stopped waiting: signal the call to stop; until it does, it counts as overrunning."""
        self.cancel.set()
        bulkhead = self.bulkhead
        with bulkhead._cond:
            if self._ended or self._overrunning:
                return
            self._overrunning = True
            bulkhead.overrunning += 1
            TOOL_OVERRUNNING.labels(tool=bulkhead.label).inc()
            TOOL_OVERRUNS.labels(tool=bulkhead.label).inc()
            bulkhead._cond.notify_all()  # a caller waiting for a slot may now be refused at once

    def _work(self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            with cancel_scope(self.cancel):
                result = fn(*args)
        except BaseException as exc:  # handed to the caller through the future
            error = exc
        finally:
            self._release()
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def _release(self) -> None:
        bulkhead = self.bulkhead
        with bulkhead._cond:
            if self._ended:
                return
            self._ended = True
            bulkhead.running -= 1
            if self._overrunning:
                bulkhead.overrunning -= 1
                TOOL_OVERRUNNING.labels(tool=bulkhead.label).dec()
            bulkhead._cond.notify_all()


_bulkheads: dict[str, Bulkhead] = {}
_bulkheads_lock = threading.Lock()


def admit(key: str, *, label: str, wait: float) -> Slot:
    """A slot in the bulkhead ``key`` (``"<tenant id>:<tool name>"``); ``label`` names the tool in metrics."""
    with _bulkheads_lock:
        bulkhead = _bulkheads.get(key)
        if bulkhead is None:
            bulkhead = _bulkheads[key] = Bulkhead(size(), label[:100])
    return bulkhead.acquire(wait)
