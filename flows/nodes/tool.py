"""A tool node: one call through the tenant's tool gateway (its checks, rate limits, approvals, audit), with the call id
``fl:<run>:<node>`` on every attempt (``ToolContext.call_key``), so the gateway's exactly-once guard for write tools
finds a restarted write's ``started`` row whatever the run's step is by then."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from agents.engine import session_grants
from agents.hooks import callable_tools, resolvable_tools, tool_allowed_as_read
from agents.models import Run
from approvals.gate import ApprovalGate
from audit.unit_of_work import StepAudit
from flows.models import FlowNodeRun
from flows.nodes.base import Attempt, NodeFailed, NodeWaits, Wave
from runtime.flow_plan import call_id
from runtime.flows import BodyNode, FlowDefinition
from runtime.types import Event, ToolCall, ToolContext, ToolStatus
from tools.gateway import PendingCall, ToolGateway


def named_tools(tenant_id: int, names: list[str]) -> list[Any]:
    return list(callable_tools(tenant_id).filter(name__in=names))


def flow_tools(run: Run, flow: FlowDefinition) -> list[Any]:
    """The tenant's tools a flow's tool nodes name (its tool list), resolved once per task."""
    return named_tools(run.tenant_id, sorted(flow.tool_names()))


def retryable(node: BodyNode, run: Run, tools: list[Any] | None = None) -> bool:
    """A tool node is tried again only when its tool is idempotent."""
    if tools is not None:
        tool = next((t for t in tools if t.name == node.tool), None)
    else:
        tool = resolvable_tools(run.tenant_id).filter(name=node.tool).only("idempotent").first()
    return bool(tool is not None and getattr(tool, "idempotent", False))


class _Raises:
    """A call whose beginning raised: collecting it raises the same error, as if it had been raised there."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def result(self) -> Any:
        raise self.error


@dataclass
class Started:
    """A tool node's call, begun (:func:`start`) and collected by :func:`run`: in a wave, every first attempt is begun
    before any is collected (:func:`start_wave`)."""

    call: ToolCall
    pending: PendingCall | _Raises
    began: float


def start(a: Attempt) -> Started:
    """Every gateway stage of the node's call, a write's ``started`` row and the hand-off to its bulkhead. An error
    on the way is kept and raised when the call is collected (:func:`run`), as if the node had raised it there."""
    run, node, wave = a.run, a.node, a.wave
    try:
        if wave is not None:
            tools, grants = wave.tools, wave.grants
        else:  # a node task: its own tool, and the conversation's grants only when the tool asks for scopes
            tools = named_tools(run.tenant_id, [node.tool])
            grants = session_grants(run) if any(t.required_scopes for t in tools) else set()
        # a node task read its tool just now (above): its policy is decided from that row, not read again
        policy = wave.tool_policy if wave is not None else tool_allowed_as_read
        gateway = ToolGateway(run=run, tools=tools, audit=a.audit, grants=grants, approvals=ApprovalGate(run),
                              tool_policy=policy)
        gateway.whitelist = a.flow.tool_names()  # the flow's tool nodes are its tool list
        call = ToolCall(id=call_id(run.pk, a.row_id), name=node.tool or "", arguments=json.dumps(a.inputs, default=str))
        began = time.monotonic()
        context = ToolContext(run_id=str(run.pk), step=run.step, span_id=a.span, call_key=call.id)
        return Started(call, gateway.start(call, context), began)
    except Exception as exc:
        return Started(ToolCall(id=call_id(run.pk, a.row_id), name=node.tool or "", arguments="{}"), _Raises(exc),
                       time.monotonic())


def start_wave(run: Run, flow: FlowDefinition, todo: list[tuple[FlowNodeRun, str, BodyNode, StepAudit, list[Event]]],
               wave: Wave) -> dict[str, Started]:
    """Begin the first attempt of a wave's tool nodes, so their tools run side by side: every gateway stage (and a
    write's ``started`` row) here, in this thread, one node after another; the calls then run on their bulkheads'
    threads while the attempts collect them in order (a beginning that raised raises there, as if the node had
    raised it). With one tool node there is nothing to overlap: it runs as in a task."""
    tools = [(node, row, audit) for row, _, node, audit, _ in todo if node.kind == "tool" and "_mapping_error" not in row.inputs]
    if len(tools) < 2:
        return {}
    return {row.node_id: start(Attempt(run, flow, node, row.node_id, row.inputs, {}, row.span_id, audit, [], wave))
            for node, row, audit in tools}


def run(a: Attempt, started: Started | None = None) -> Any:
    """Collect the call (begin it first unless the wave did): its result, parsed when it is JSON."""
    if started is None:
        started = start(a)
    call, outcome = started.call, started.pending.result()
    a.trace.append(Event("tool.call", {"tool": a.node.tool, "call_id": call.id, "status": str(outcome.status),
                                       "latency_ms": int((time.monotonic() - started.began) * 1000), "node": a.node.id},
                         parent_span_id=a.span))
    if outcome.status == ToolStatus.PENDING_APPROVAL:
        raise NodeWaits(outcome.content)
    if outcome.status != ToolStatus.OK:
        raise NodeFailed(f"{outcome.status}: {outcome.content}")
    try:
        return json.loads(outcome.content)
    except ValueError:
        return outcome.content
