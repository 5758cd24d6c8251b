"""Replays' own Prometheus series (issue #16): a replay never moves the tenant's run, token, cost or tool series
(it commits no trace event, which is what feeds ``agents.metrics``); it is counted here instead, once its batch's
chunk of results has committed."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from prometheus_client import Counter

log = logging.getLogger(__name__)

REPLAY_RUNS = Counter("agentops_replay_runs", "Replayed runs, by model mode and result (passed/failed/skipped/error).",
                      ["mode", "result"])
REPLAY_COST = Counter("agentops_replay_cost", "Model cost of live-mode replays (counted apart from the tenant's spend).",
                      ["mode"])
REPLAY_LIVE_TOOL_CALLS = Counter("agentops_replay_live_tool_calls",
                                 "Read-tool calls a replay made live through the tool gateway (miss policy live_read).")


def result_of(row: Any) -> str:
    if row.status != "replayed":
        return str(row.status)
    return "passed" if row.passed else "failed"


def observe(mode: str, rows: Iterable[Any]) -> None:
    """Count a committed chunk of ``ReplayRun`` rows. Never raises into the caller."""
    try:
        for row in rows:
            REPLAY_RUNS.labels(mode=mode, result=result_of(row)).inc()
            if row.cost:
                REPLAY_COST.labels(mode=mode).inc(float(row.cost))
            if row.live_tool_calls:
                REPLAY_LIVE_TOOL_CALLS.inc(row.live_tool_calls)
    except Exception:  # metrics never break a replay
        log.exception("replay metrics: could not count a chunk")
