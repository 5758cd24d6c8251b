"""Test-only Python tools that outlive their timeout (registered under ``test_hung.*`` keys when imported).

``hang`` ignores the cancel signal and waits until the test releases its tag; ``cooperative``
stops when the call's cancel signal is set; ``spin`` writes its process id and never returns
(for process isolation); ``whoami`` and ``use_database`` show where an isolated call runs.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from tools.cancel import cancelled, current_cancel
from tools.pyfunc import registry, tool

_lock = threading.Lock()
_releases: dict[str, threading.Event] = {}
#: tag -> what a cooperative call saw when it stopped: ``{"cancelled": bool, "after": seconds}``.
STOPPED: dict[str, dict[str, Any]] = {}


def _release_event(tag: str) -> threading.Event:
    with _lock:
        return _releases.setdefault(tag, threading.Event())


def release(tag: str) -> None:
    """Let every ``hang`` call with this tag return."""
    _release_event(tag).set()


if "test_hung.hang" not in registry:

    @tool(key="test_hung.hang", category="read")
    def hang(tag: str, seconds: float) -> dict[str, Any]:
        """Wait until the test releases ``tag`` (at most ``seconds``), ignoring the cancel signal (test tool)."""
        released = _release_event(tag).wait(seconds)
        return {"tag": tag, "released": released}

    @tool(key="test_hung.cooperative", category="read")
    def cooperative(tag: str, seconds: float) -> dict[str, Any]:
        """Work in small steps for ``seconds``, stopping as soon as the call is cancelled (test tool)."""
        started = time.monotonic()
        signal = current_cancel()
        while time.monotonic() - started < seconds and not signal.wait(0.01):
            pass
        STOPPED[tag] = {"cancelled": cancelled(), "after": time.monotonic() - started}
        return {"tag": tag, "stopped_early": cancelled()}

    @tool(key="test_hung.spin", category="read")
    def spin(pid_file: str) -> dict[str, Any]:
        """Write this process's id to ``pid_file``, then busy-loop forever (test tool, for process isolation)."""
        with open(pid_file, "w") as handle:
            handle.write(str(os.getpid()))
        while True:
            pass

    @tool(key="test_hung.whoami", category="read")
    def whoami() -> dict[str, Any]:
        """The id of the process the call runs in (test tool)."""
        return {"pid": os.getpid()}

    @tool(key="test_hung.use_database", category="read")
    def use_database() -> dict[str, Any]:
        """Run a query (test tool: refused in an isolated process)."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return {"row": list(cursor.fetchone())}
