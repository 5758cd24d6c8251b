"""Prometheus metrics of runs, model calls and tool calls, derived from committed trace events.

One place feeds them: :func:`observe_committed`, called by the run store once per committed
step with that step's ``RunEvent`` rows (and by anything else that commits events through
``agents.store.publish_after_commit``). The counters move only after the transaction
commits, so a rolled-back step is never counted, and nothing here queries the database per
event (the agent's slug is read once per agent per process and cached).

Labels are bounded by configuration (agent slugs, model names, tool names, terminal reasons,
tool statuses); run, session, user and call ids never become labels.

How the Celery workers' metrics reach ``/metrics``
-------------------------------------------------
Embedded mode runs the worker as threads of the server process: one registry, nothing to do.

In production the workers are separate processes. We use prometheus_client's *multiprocess
mode*: ``config/settings.py`` sets ``PROMETHEUS_MULTIPROC_DIR`` (default ``$AGENTOPS_VAR_DIR/
prometheus``; an explicit environment value wins) before prometheus_client is imported, so
every process (ASGI server, each worker and prefork child) writes its samples to memory-mapped
files there, and django-prometheus's ``/metrics`` view aggregates all the files. Requirements
and caveats:

- the server and the workers must share that directory (same host or a shared volume); workers
  on other hosts need their own scrape target instead (``prometheus_client.start_http_server``
  in a ``worker_process_init`` handler) — not needed for one-host deployments;
- the directory must be emptied by the deployment *before* the processes start (e.g. a systemd
  ``ExecStartPre`` or the container entrypoint), never by a running process: a process's files
  stay summed after it exits, which is what counters want, and a restart resets them;
- counters and histograms need nothing more; the one gauge kept in process memory
  (``agentops_tool_calls_overrunning``, moved by the tool gateway itself) is declared ``multiprocess_mode="livesum"``: the
  live processes' values are summed, and a process that exits drops its own file (a killed one's
  stays until the directory is emptied at the next start).

We chose this over a metrics port per worker because one scrape target then shows the whole
system, and the live-stack tests can check the worker's counters through the server's
``/metrics`` in both run modes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from prometheus_client import Counter, Histogram

from agents.models import ACTIVE_STATUSES, Run
from approvals.models import ApprovalRequest, ApprovalStatus
from runtime.types import TerminalReason

log = logging.getLogger(__name__)

RUNS = Counter(
    "agentops_runs", "Finished runs, by agent and terminal reason.", ["agent", "status"],
)
RUN_STEPS = Histogram(
    "agentops_run_steps", "Steps per finished run.", buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 100),
)
LLM_TOKENS = Counter("agentops_llm_tokens", "Model tokens, by model and type (input/output).", ["model", "type"])
LLM_COST = Counter("agentops_llm_cost", "Model cost in the price table's currency, by model.", ["model"])
LLM_DURATION = Histogram(
    "agentops_llm_request_duration_seconds", "Model call latency, by model.", ["model"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
LLM_ERRORS = Counter(
    "agentops_llm_errors", "Model calls that failed after every route and retry (the run ended in error), by model.", ["model"],
)
LLM_ATTEMPTS = Counter(
    "agentops_llm_attempts",
    "Model gateway attempts, by provider and outcome (ok, timeout, rate_limited, server_error, circuit_open, ...).",
    ["provider", "outcome"],
)
RUN_LIMITS = Counter(
    "agentops_run_limits_hit",
    "Runs stopped by a limit (model-call/step limit, recursion, budget, loop, wall time), by agent and the limit that "
    "decided (the hook's name, else the terminal reason).",
    ["agent", "limit"],
)
#: Terminal reasons that mean a limit stopped the run.
LIMIT_REASONS = frozenset({TerminalReason.LIMIT_REACHED, TerminalReason.MAX_RECURSION, TerminalReason.BUDGET_EXCEEDED,
                           TerminalReason.LOOP_DETECTED, TerminalReason.TIMEOUT})
TOOL_CALLS = Counter("agentops_tool_calls", "Tool calls, by tool and outcome (the call's status).", ["tool", "outcome"])
TOOL_DURATION = Histogram(
    "agentops_tool_call_duration_seconds", "Tool call latency as audited by the tool gateway, by tool.", ["tool"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
_agent_slugs: dict[int, str] = {}
_agent_slugs_lock = threading.Lock()
_AGENT_CACHE_MAX = 10_000


def _agent_label(run: Any) -> str:
    """The run's agent slug: from the already loaded relation, else one cached lookup per agent."""
    relation = getattr(type(run), "agent", None)
    if relation is not None and relation.is_cached(run) and run.agent is not None:
        return str(run.agent.slug)
    agent_id = getattr(run, "agent_id", None)
    if agent_id is None:
        return "unknown"
    with _agent_slugs_lock:
        slug = _agent_slugs.get(agent_id)
    if slug is None:
        from agents.models import Agent

        slug = Agent.objects.filter(pk=agent_id).values_list("slug", flat=True).first() or "unknown"
        with _agent_slugs_lock:
            if len(_agent_slugs) >= _AGENT_CACHE_MAX:
                _agent_slugs.clear()
            _agent_slugs[agent_id] = slug
    return slug


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if number >= 0 else 0.0


def _label(value: Any, default: str = "unknown") -> str:
    text = str(value) if value not in (None, "") else default
    return text[:100]


def samples(agent: str, steps: int, rows: Iterable[Any]) -> list[tuple[Any, dict[str, str], str, float]]:
    """The observations a step's rows produce: ``(metric, labels, "inc"|"observe", value)``. Pure, for tests."""
    rows = list(rows)
    tool_of_span = {row.span_id: _label(row.payload.get("tool")) for row in rows if row.type == "tool.call"}
    audited_spans = {row.parent_span_id for row in rows if row.type == "tool.audit"}
    out: list[tuple[Any, dict[str, str], str, float]] = []
    for row in rows:
        payload = row.payload if isinstance(row.payload, dict) else {}
        if row.type == "model.call":
            model = _label(payload.get("model"))
            out.append((LLM_TOKENS, {"model": model, "type": "input"}, "inc", _number(payload.get("input_tokens"))))
            out.append((LLM_TOKENS, {"model": model, "type": "output"}, "inc", _number(payload.get("output_tokens"))))
            out.append((LLM_COST, {"model": model}, "inc", _number(payload.get("cost"))))
            if payload.get("latency_ms") is not None:
                out.append((LLM_DURATION, {"model": model}, "observe", _number(payload["latency_ms"]) / 1000))
        elif row.type == "model.error":
            out.append((LLM_ERRORS, {"model": _label(payload.get("model"))}, "inc", 1.0))
        elif row.type == "model.attempt":
            labels = {"provider": _label(payload.get("provider")), "outcome": _label(payload.get("outcome"))}
            out.append((LLM_ATTEMPTS, labels, "inc", 1.0))
        elif row.type == "tool.call":
            tool = tool_of_span[row.span_id]
            out.append((TOOL_CALLS, {"tool": tool, "outcome": _label(payload.get("status"))}, "inc", 1.0))
            if row.span_id not in audited_spans and payload.get("latency_ms") is not None:
                out.append((TOOL_DURATION, {"tool": tool}, "observe", _number(payload["latency_ms"]) / 1000))
        elif row.type == "tool.audit":
            tool = tool_of_span.get(row.parent_span_id, "unknown")
            if payload.get("latency_ms") is not None:
                out.append((TOOL_DURATION, {"tool": tool}, "observe", _number(payload["latency_ms"]) / 1000))
        elif row.type == "run.finished":
            status = _label(payload.get("terminal_reason"), "error")
            out.append((RUNS, {"agent": agent, "status": status}, "inc", 1.0))
            out.append((RUN_STEPS, {}, "observe", float(steps)))
            if status in LIMIT_REASONS:
                out.append((RUN_LIMITS, {"agent": agent, "limit": _label(payload.get("decided_by"), status)}, "inc", 1.0))
    return out


def _apply(observations: list[tuple[Any, dict[str, str], str, float]]) -> None:
    for metric, labels, how, value in observations:
        target = metric.labels(**labels) if labels else metric
        if how == "inc":
            target.inc(value)
        else:
            target.observe(value)


PLAYGROUND_RUNS = Counter(
    "agentops_playground_runs", "Finished playground runs (console), by outcome; kept out of the run, token and cost series.",
    ["status"])
#: A playground run's tokens, cost and outcome stay out of the business series (counted in PLAYGROUND_RUNS instead);
#: its model latency, errors, attempts and tool calls are still observed (they say how the providers and tools behave).
_BUSINESS = (RUNS, RUN_STEPS, RUN_LIMITS, LLM_TOKENS, LLM_COST)


def without_playground(run: Any, observations: list[tuple[Any, dict[str, str], str, float]]) -> list[Any]:
    """A playground run's observations: the business series swapped for ``agentops_playground_runs_total``."""
    if not getattr(run, "playground", False):
        return observations
    kept = [obs for obs in observations if obs[0] not in _BUSINESS]
    kept += [(PLAYGROUND_RUNS, {"status": obs[1]["status"]}, "inc", 1.0) for obs in observations if obs[0] is RUNS]
    return kept


_OBSERVED = frozenset({"model.call", "model.error", "model.attempt", "tool.call", "tool.audit", "run.finished"})


def observe_committed(run: Any, rows: list[Any]) -> None:
    """Count a step's events once its transaction commits. Never raises into the caller."""
    try:
        relevant = [r for r in rows if r.type in _OBSERVED]
        if not relevant:
            return
        agent = _agent_label(run) if any(r.type == "run.finished" for r in relevant) else ""
        observations = without_playground(run, samples(agent, int(getattr(run, "step", 0) or 0), relevant))
    except Exception:
        log.warning("could not derive metrics from run %s's events", getattr(run, "pk", "?"), exc_info=True)
        return

    def apply() -> None:
        try:
            _apply(observations)
        except Exception:
            log.warning("could not record metrics", exc_info=True)

    transaction.on_commit(apply)


# -- approvals ---------------------------------------------------------------------------------

class ApprovalQueueCollector:
    """``agentops_approvals_pending`` and ``agentops_approval_oldest_pending_seconds`` per tenant, read at scrape time.

    Gauges of a queue are a property of the database, not of a process: one grouped query per scrape.
    """

    def collect(self) -> Iterable[Any]:
        from django.db.models import Count, Min
        from django.utils import timezone
        from prometheus_client.core import GaugeMetricFamily

        pending = GaugeMetricFamily("agentops_approvals_pending", "Approval requests waiting for a decision.", labels=["tenant"])
        oldest = GaugeMetricFamily(
            "agentops_approval_oldest_pending_seconds", "Age of the oldest pending approval request.", labels=["tenant"]
        )
        now = timezone.now()
        rows = (
            ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
            .values("tenant__slug")
            .annotate(count=Count("id"), first=Min("requested_at"))
        )
        for row in rows:
            pending.add_metric([row["tenant__slug"]], row["count"])
            oldest.add_metric([row["tenant__slug"]], max(0.0, (now - row["first"]).total_seconds()))
        yield pending
        yield oldest


class RunQueueCollector:
    """``agentops_runs_active`` and ``agentops_run_oldest_idle_seconds`` per tenant and status, read at scrape time.

    One grouped query per scrape over the active runs (``status`` is indexed). The idle age is the time since the
    least recently changed run in that status was last written: for ``queued`` how long it has waited for a worker,
    for ``running`` how long since its last step committed, for ``waiting`` how long an approval has been pending.
    Registered with the other database gauges in ``console/metrics_view.py``.
    """

    def collect(self) -> Iterable[Any]:
        from django.db.models import Count, Min
        from django.utils import timezone
        from prometheus_client.core import GaugeMetricFamily

        active = GaugeMetricFamily("agentops_runs_active", "Runs queued, running or waiting for approval.",
                                   labels=["tenant", "status"])
        oldest = GaugeMetricFamily(
            "agentops_run_oldest_idle_seconds",
            "Seconds since the least recently changed run in this status was written (queued: waiting for a worker).",
            labels=["tenant", "status"],
        )
        now = timezone.now()
        rows = (Run.objects.filter(status__in=ACTIVE_STATUSES).order_by().values("tenant__slug", "status")
                .annotate(count=Count("id"), first=Min("updated_at")))
        for row in rows:
            labels = [row["tenant__slug"], row["status"]]
            active.add_metric(labels, row["count"])
            oldest.add_metric(labels, max(0.0, (now - row["first"]).total_seconds()))
        yield active
        yield oldest
