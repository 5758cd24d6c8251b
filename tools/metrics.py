"""Prometheus metrics the tool layer moves itself: overrunning and killed tool calls.

Process state, not derived from committed trace events (those are in ``agents/metrics.py``): the
bulkheads (tools/bulkhead.py) and the process isolation (tools/isolation.py) move them as it happens.
See ``agents/metrics.py`` for how a worker's samples reach ``/metrics`` (multiprocess mode).
"""

from __future__ import annotations

import atexit
import os

from django.conf import settings
from prometheus_client import Counter, Gauge

# Moved by the bulkheads as calls overrun and end.
TOOL_OVERRUNNING = Gauge(
    "agentops_tool_calls_overrunning",
    "Tool calls still running after their timeout (each holds one of its tool's bulkhead slots until it ends), by tool.",
    ["tool"], multiprocess_mode="livesum",
)
TOOL_OVERRUNS = Counter(
    "agentops_tool_call_overruns", "Tool calls still running when their timeout passed (each was sent its cancel signal), by tool.",
    ["tool"],
)
TOOL_KILLED = Counter(
    "agentops_tool_calls_killed", "Process-isolated tool calls whose process was killed at the timeout, by tool.", ["tool"],
)


def _forget_live_gauges() -> None:
    """At exit, in multiprocess mode, drop this process's live gauge files: its overrunning calls end with it."""
    if settings.PROMETHEUS_MULTIPROC_DIR:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())


atexit.register(_forget_live_gauges)
