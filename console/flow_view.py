"""A flow run on the trace page: its graph coloured by node state, and its nodes as spans in parallel lanes.

The initial state is the run's FlowNodeRun rows (the source of truth); static/console/trace.js then follows the
``flow.node.*`` trace events live, with the same lane rule as :func:`lanes` here. Every tenant-written text (node ids,
outputs) is escaped: ``render_svg`` escapes, the template autoescapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from agents.flow_graph import render_svg
from agents.models import AgentKind
from flows.models import FlowNodeRun
from runtime.flows import FlowDefinition

#: The page's node states: a row's ``done`` is shown as ``succeeded``; a node without a row is ``pending``.
STATE_NAMES = {"done": "succeeded"}
#: One lane's height in the timeline's SVG (trace.js uses the same).
LANE_PX = 26


def node_state(status: str) -> str:
    return STATE_NAMES.get(status, status or "pending")


@dataclass(frozen=True)
class NodeSpan:
    node_id: str
    kind: str
    state: str
    span_id: str
    start: datetime
    end: datetime | None
    lane: int = 0

    @property
    def duration_ms(self) -> int | None:
        return None if self.end is None else max(int((self.end - self.start).total_seconds() * 1000), 0)


def lanes(spans: list[NodeSpan]) -> list[NodeSpan]:
    """Each span in the first lane free at its start (a lane is free once its last span ended; a running span
    holds its lane), so nodes that ran at the same time sit in different lanes. Ordered by start, then node id."""
    ends: list[datetime | None] = []
    placed = []
    for span in sorted(spans, key=lambda s: (s.start, s.node_id)):
        lane = next((i for i, end in enumerate(ends) if end is not None and end <= span.start), len(ends))
        if lane == len(ends):
            ends.append(span.end)
        else:
            ends[lane] = span.end
        placed.append(NodeSpan(**{**span.__dict__, "lane": lane}))
    return placed


def _fmt_ms(value: int | None) -> str:
    if value is None:
        return "running"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value} ms"


def flow_context(run: Any) -> dict[str, Any] | None:
    """The flow part of the trace page, or None when the run is not a flow's (or its definition does not parse)."""
    if run.agent.kind != AgentKind.FLOW or not run.version.definition:
        return None
    try:
        flow = FlowDefinition.model_validate(run.version.definition)
    except ValueError:
        return None
    rows = list(FlowNodeRun.objects.filter(run_id=run.pk).only(
        "node_id", "kind", "status", "span_id", "started_at", "finished_at"))
    states = {n.id: "pending" for n in flow.nodes} | {r.node_id: node_state(r.status) for r in rows}
    spans = lanes([NodeSpan(r.node_id, r.kind, node_state(r.status), r.span_id, r.started_at, r.finished_at)
                   for r in rows if r.started_at is not None])
    t0 = min((s.start for s in spans), default=None)
    t1 = max((s.end or s.start for s in spans), default=None)
    total = max(((t1 - t0).total_seconds() if t0 and t1 else 0) * 1000, 1)
    shown = [{
        "node": s.node_id, "kind": s.kind, "state": s.state, "span_id": s.span_id, "lane": s.lane,
        "y": s.lane * LANE_PX, "text_y": s.lane * LANE_PX + 15,
        "start": s.start.isoformat(), "end": s.end.isoformat() if s.end else None, "duration": _fmt_ms(s.duration_ms),
        "left": f"{(s.start - t0).total_seconds() * 1000 / total * 100:.3f}" if t0 else "0",
        "width": f"{max(((s.end or t1) - s.start).total_seconds() * 1000 / total * 100, 0.5):.3f}" if t1 else "100",
    } for s in spans]
    kinds = {n.id: n.kind for n in flow.nodes}
    graph: SafeString = mark_safe(render_svg(flow, states))  # noqa: S308 (render_svg escapes every tenant-written text)
    return {
        "graph": graph,
        "states": states,
        "kinds": kinds,
        "spans": shown,
        "lane_count": 1 + max((s.lane for s in spans), default=-1),
        "height": max(1 + max((s.lane for s in spans), default=-1), 1) * LANE_PX,
    }
