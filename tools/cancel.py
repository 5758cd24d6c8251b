"""Cooperative cancellation of tool calls: the gateway's signal that a call's time is up.

Every call the tool gateway runs gets a cancel signal (a ``threading.Event``), set when the
call's ``timeout_seconds`` pass. The gateway stops waiting then and tells the model there was
no result, but Python cannot stop a thread from outside: the function keeps running, and keeps
one of its tool's bulkhead slots, until it returns. A function that may run long should look
at the signal and stop::

    from tools.cancel import check_cancelled, current_cancel

    @tool("reports.build")
    def build(month: str) -> dict:
        for page in pages(month):
            check_cancelled()              # raises ToolCancelled once the call's time is up
            render(page)
        if current_cancel().wait(2.0):     # instead of time.sleep(2.0): wakes up at once when cancelled
            return {"done": False}
        ...

Executors get the same signal as ``ctx.cancel`` / ``ctx.cancelled`` (:class:`tools.executors.ExecContext`).
Outside a gateway call, :func:`current_cancel` returns an event nobody sets.
A function that cannot check (a blocking C call, a library that never returns) should run in
its own process instead: ``config = {"isolation": "process"}`` (:mod:`tools.isolation`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["ToolCancelled", "cancel_scope", "cancelled", "check_cancelled", "current_cancel"]

_current: ContextVar[threading.Event | None] = ContextVar("agentops_tool_cancel", default=None)


class ToolCancelled(Exception):
    """The call's time is up (raised by :func:`check_cancelled`); the gateway has already reported a timeout."""


def current_cancel() -> threading.Event:
    """The running call's cancel signal (a new, never-set event outside a gateway call)."""
    event = _current.get()
    return event if event is not None else threading.Event()


def cancelled() -> bool:
    """True once the running call's time is up."""
    event = _current.get()
    return event is not None and event.is_set()


def check_cancelled() -> None:
    """Raise :class:`ToolCancelled` if the running call's time is up."""
    if cancelled():
        raise ToolCancelled("the tool call's time is up; stop and return")


@contextmanager
def cancel_scope(event: threading.Event) -> Iterator[threading.Event]:
    """Make ``event`` the cancel signal of the code run inside the block (the gateway's worker does this)."""
    token = _current.set(event)
    try:
        yield event
    finally:
        _current.reset(token)
