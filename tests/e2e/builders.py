"""Runs with a trace, written straight to the database (no worker): for the console's page tests."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from agents.models import Run, RunEvent, RunStatus, Session
from tests.factories import World

SCRIPT_OUTPUT = '<script>window.__pwned = true; document.title = "pwned"</script><img src=x onerror="window.__pwned=true">'


def make_run(world: World, *, status: str = RunStatus.FINISHED, reason: str = "final_answer", usage: dict[str, Any] | None = None,
             created_at: dt.datetime | None = None, user: Any = None, content: str = "Order O1 ships today.",
             with_events: bool = True) -> Run:
    """A run of ``world``'s agent with a small, realistic trace (run, model call, tool call, finish)."""
    session = Session.objects.create(tenant=world.tenant, agent=world.agent, created_by=user or world.operator)
    now = created_at or timezone.now()
    usage = usage if usage is not None else {"input_tokens": 120, "output_tokens": 30, "cost": 0.0015}
    run = Run.objects.create(
        tenant=world.tenant, agent=world.agent, version=world.version, session=session, created_by=user or world.operator,
        input="where is order O1?", status=status, terminal_reason=reason if status == RunStatus.FINISHED else "",
        usage=usage, step=3, started_at=now, finished_at=now + dt.timedelta(seconds=2) if status == RunStatus.FINISHED else None,
        output=content if status == RunStatus.FINISHED else "",
    )
    if created_at is not None:
        Run.objects.filter(pk=run.pk).update(created_at=created_at)
        run.created_at = created_at
    if with_events:
        add_events(run, trace_events(content, finished=status == RunStatus.FINISHED), start=now)
    return run


def trace_events(content: str, *, finished: bool = True) -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(type, span, parent, payload)`` for a one-tool run; span names are placeholders made unique per run."""
    events: list[tuple[str, str, str, dict[str, Any]]] = [
        ("run.started", "root", "root", {"model": "demo/planner", "tools": ["order_desk.query_order"], "context_tokens": 80}),
        ("state.transition", "s1", "root", {"from": "planning", "to": "planning", "reason": "start"}),
        ("planner.plan", "p1", "m1", {"intent": "query_order"}),
        ("model.call", "m1", "root", {"model": "demo/planner", "input_tokens": 100, "output_tokens": 10, "cost": 0.001,
                                      "latency_ms": 12.5, "finish_reason": "tool_calls", "content": "",
                                      "tool_calls": [{"id": "c1", "name": "order_desk.query_order", "arguments": "{}"}]}),
        ("state.transition", "s2", "root", {"from": "planning", "to": "acting", "reason": "tool calls"}),
        ("tool.stage", "t1s", "t1", {"stage": "resolve", "ok": True}),
        ("tool.audit", "t1a", "t1", {"status": "ok", "latency_ms": 7, "category": "read"}),
        ("tool.call", "t1", "root", {"tool": "order_desk.query_order", "call_id": "c1", "status": "ok",
                                     "result": "order O1: shipped", "latency_ms": 8.0}),
        ("hook.decision", "h1", "root", {"hook": "model_call_limit", "position": "before_model", "updates": [], "jump_to": None,
                                         "reason": "under the limit"}),
        ("approval.requested", "a1", "root", {"tool": "refund", "approval_id": 42}),
        ("model.call", "m2", "root", {"model": "demo/planner", "input_tokens": 20, "output_tokens": 20, "cost": 0.0005,
                                      "latency_ms": 5, "finish_reason": "stop", "content": content, "tool_calls": []}),
    ]
    if finished:
        events += [
            ("state.transition", "s3", "root", {"from": "planning", "to": "finished", "reason": "final answer"}),
            ("run.finished", "root", "root", {"terminal_reason": "final_answer", "output": content, "reason": "final_answer"}),
        ]
    return events


def add_events(run: Run, events: list[tuple[str, str, str, dict[str, Any]]], *, start: dt.datetime | None = None) -> list[RunEvent]:
    salt = run.pk.hex[:8]
    start = start or timezone.now()
    first = run.last_seq + 1
    rows = [
        RunEvent(tenant_id=run.tenant_id, run=run, seq=first + i, step=1 + i // 4, type=type_, span_id=f"{span}-{salt}",
                 parent_span_id=f"{parent}-{salt}", payload=payload, at=start + dt.timedelta(milliseconds=20 * (i + 1)))
        for i, (type_, span, parent, payload) in enumerate(events)
    ]
    RunEvent.objects.bulk_create(rows)
    run.last_seq = first + len(rows) - 1
    Run.objects.filter(pk=run.pk).update(last_seq=run.last_seq)
    return rows
