"""Executes a flow run (issue #15): the database's node rows are the state, :func:`runtime.flows.plan` the scheduler.

A flow run is a :class:`agents.models.Run` whose version holds a graph. ``agents.services.execute_run`` takes the run's
lease and hands it here (``agents/flow_hook.py``). Each pass reads the committed node rows, asks ``plan`` which nodes
are ready or skipped, and runs the ready ones; each node's completion commits in one transaction: its row, its trace
events (a span per node: ``flow.node.started`` / ``flow.node.finished``), its tool audit rows and the run's counters.
A worker killed mid-flow leaves the run leased; the sweeper re-enqueues it and the next worker resumes from the
committed rows: a finished node never runs again, and a tool node's call id is ``flow:<run>:<node>`` so a write tool
the gateway already started is caught by its exactly-once guard.

Nodes run one after another inside the run's task here (the scheduler's ``max_parallel`` bounds a pass); see the
README's "Flows" section for what is not built yet (separate Celery tasks per node, approval and agent nodes).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agents.engine import session_grants
from agents.hooks import resolvable_tools, tool_allowed_for
from agents.models import Run, RunEvent, RunStatus
from agents.services import finish_without_worker
from agents.store import event_rows, publish_after_commit, run_summary
from approvals.gate import ApprovalGate
from audit.unit_of_work import StepAudit
from flows.models import FlowNodeRun, NodeStatus
from runtime.flows import FlowDefinition, Node, choose, evaluate, node_arguments, plan, render
from runtime.types import Event, ModelRequest, TerminalReason, ToolCall, ToolContext, ToolStatus, new_span_id
from tools.gateway import ToolGateway

log = logging.getLogger(__name__)

SUMMARY_CHARS = 500


class NodeFailed(Exception):
    pass


class NodeWaits(Exception):
    pass


def _summary(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text[:SUMMARY_CHARS]


def flow_input(run: Run) -> Any:
    try:
        return json.loads(run.input)
    except ValueError:
        return run.input


def _scope(run: Run, rows: dict[str, FlowNodeRun]) -> dict[str, Any]:
    nodes = {nid: r.output for nid, r in rows.items() if r.status in (NodeStatus.DONE, NodeStatus.FAILED)}
    return {"input": flow_input(run), "nodes": nodes}


def _rows(run: Run) -> dict[str, FlowNodeRun]:
    return {r.node_id: r for r in FlowNodeRun.objects.filter(run=run)}


def _append(run: Run, events: list[Event]) -> list[RunEvent]:
    """Write events at the run's next seqs (the caller holds the run's row lock, inside its transaction)."""
    locked = Run.objects.select_for_update().only("last_seq", "step").get(pk=run.pk)
    rows = event_rows(run, locked.last_seq + 1, locked.step, events)
    RunEvent.objects.bulk_create(rows)
    Run.objects.filter(pk=run.pk).update(last_seq=F("last_seq") + len(rows), step=F("step") + 1)
    run.last_seq = locked.last_seq + len(rows)
    return rows


def run_flow(run: Run, token: str) -> None:
    """Run the flow's ready nodes until it finishes or waits. Safe to call again after a crash."""
    flow = FlowDefinition.model_validate(run.version.definition)
    while True:
        run.refresh_from_db(fields=["cancel_requested", "status", "last_seq"])
        if run.cancel_requested:
            with transaction.atomic():
                finish_without_worker(run, TerminalReason.CANCELLED, "cancelled")
            return
        rows = _rows(run)
        states = {nid: r.status for nid, r in rows.items()}
        chosen = {nid: r.chosen for nid, r in rows.items() if r.kind == "switch" and r.status == NodeStatus.DONE}
        routed = [flow.node(nid).handler for nid, r in rows.items()
                  if r.status == NodeStatus.FAILED and flow.node(nid).on_error == "route"]
        # A node left "running" by a dead worker is run again (its tool call id is the same: exactly once).
        stale = [nid for nid, s in states.items() if s == NodeStatus.RUNNING]
        for nid in stale:
            states[nid] = NodeStatus.PENDING
        step = plan(flow, states, chosen, routed=[r for r in routed if r])
        if step.skip:
            _skip(run, step.skip)
            continue
        if step.outcome is not None:
            _finish(run, flow, step.outcome, step.failed_node, _rows(run))
            return
        if not step.ready:
            if any(s == NodeStatus.WAITING for s in states.values()):
                _wait(run)
            return
        for node_id in step.ready:
            _run_node(run, flow, flow.node(node_id), rows.get(node_id))
            rows = _rows(run)


def _skip(run: Run, node_ids: tuple[str, ...]) -> None:
    with transaction.atomic():
        now = timezone.now()
        for nid in node_ids:
            FlowNodeRun.objects.update_or_create(run=run, node_id=nid, defaults={
                "tenant_id": run.tenant_id, "kind": "", "status": NodeStatus.SKIPPED, "finished_at": now})
        rows = _append(run, [Event("flow.node.skipped", {"node": nid}) for nid in node_ids])
        publish_after_commit(run, rows, run_summary(run))


def _run_node(run: Run, flow: FlowDefinition, node: Node, row: FlowNodeRun | None) -> None:
    span = row.span_id if row is not None and row.span_id else new_span_id()
    scope = _scope(run, _rows(run))
    attempt = (row.attempt if row is not None else 0) + 1
    with transaction.atomic():
        try:
            inputs = node_arguments(node, scope)
        except Exception as exc:  # a mapping that cannot be evaluated (JMESPath type error)
            inputs = {"error": str(exc)}
        FlowNodeRun.objects.update_or_create(run=run, node_id=node.id, defaults={
            "tenant_id": run.tenant_id, "kind": node.kind, "status": NodeStatus.RUNNING, "attempt": attempt,
            "inputs": inputs, "span_id": span, "started_at": timezone.now()})
        rows = _append(run, [Event("flow.node.started", {"node": node.id, "kind": node.kind, "attempt": attempt,
                                                         "inputs": _summary(inputs)}, span_id=span)])
        publish_after_commit(run, rows, run_summary(run))
    audit = StepAudit()
    status, output, error, chosen = NodeStatus.DONE, None, "", []
    tries = 1 + (node.retries if node.kind in ("tool", "llm") else 0)
    for n in range(tries):
        try:
            output, chosen = _execute(run, flow, node, inputs, scope, audit, span)
            status, error = NodeStatus.DONE, ""
            break
        except NodeWaits as exc:
            status, error = NodeStatus.WAITING, str(exc)
            break
        except NodeFailed as exc:
            status, error = NodeStatus.FAILED, str(exc)
        except Exception as exc:
            log.exception("flow run %s: node %s failed", run.pk, node.id)
            status, error = NodeStatus.FAILED, f"internal error: {type(exc).__name__}"
        if n + 1 < tries:
            log.info("flow run %s: node %s attempt %s failed (%s); retrying", run.pk, node.id, n + 1, error)
    if status == NodeStatus.FAILED and node.on_error == "continue":
        output = {"error": error}
    with transaction.atomic():
        FlowNodeRun.objects.filter(run=run, node_id=node.id).update(
            status=status, output=output, chosen=chosen, error=error,
            finished_at=None if status == NodeStatus.WAITING else timezone.now())
        audit.commit(run.tenant_id)
        payload = {"node": node.id, "kind": node.kind, "status": str(status), "output": _summary(output)}
        if error:
            payload["error"] = error
        if chosen:
            payload["chosen"] = chosen
        rows = _append(run, [Event("flow.node.finished" if status != NodeStatus.WAITING else "flow.node.waiting",
                                   payload, span_id=new_span_id(), parent_span_id=span)])
        publish_after_commit(run, rows, run_summary(run))


def _execute(run: Run, flow: FlowDefinition, node: Node, inputs: dict[str, Any], scope: dict[str, Any],
             audit: StepAudit, span: str) -> tuple[Any, list[str]]:
    if node.kind == "switch":
        return {"chosen": choose(node, scope)}, choose(node, scope)
    if node.kind == "tool":
        return _tool(run, flow, node, inputs, audit, span), []
    if node.kind == "llm":
        return _llm(run, node, scope), []
    raise NodeFailed(f"{node.kind} nodes do not run yet in this version of the console")


def _tool(run: Run, flow: FlowDefinition, node: Node, inputs: dict[str, Any], audit: StepAudit, span: str) -> Any:
    names = {n.tool for n in flow.nodes if n.kind == "tool" and n.tool}
    tools = list(resolvable_tools(run.tenant_id).filter(name__in=names))
    gateway = ToolGateway(run=run, tools=tools, audit=audit, grants=session_grants(run),
                          approvals=ApprovalGate(run), tool_policy=tool_allowed_for)
    gateway.whitelist = names  # the flow's tool nodes are its tool list
    call = ToolCall(id=f"flow:{run.pk}:{node.id}", name=node.tool or "", arguments=json.dumps(inputs, default=str))
    outcome = gateway.execute(call, ToolContext(run_id=str(run.pk), step=run.step, span_id=span))
    if outcome.status == ToolStatus.PENDING_APPROVAL:
        raise NodeWaits(outcome.content)
    if outcome.status != ToolStatus.OK:
        raise NodeFailed(f"{outcome.status}: {outcome.content}")
    try:
        return json.loads(outcome.content)
    except ValueError:
        return outcome.content


def _llm(run: Run, node: Node, scope: dict[str, Any]) -> Any:
    from agents.model_clients import model_client_for

    prompt = render(node.prompt or "", scope)
    request = ModelRequest(model=node.model or run.version.model, tools=[], task="flow",
                           messages=[{"role": "user", "content": prompt}])
    response = model_client_for(run).complete(request)
    return response.content or ""


def _wait(run: Run) -> None:
    with transaction.atomic():
        Run.objects.filter(pk=run.pk).update(status=RunStatus.WAITING, phase="waiting")
        rows = _append(run, [Event("state.transition", {"from": "running", "to": "waiting"})])
        run.status = RunStatus.WAITING
        publish_after_commit(run, rows, run_summary(run))


def _finish(run: Run, flow: FlowDefinition, outcome: str, failed_node: str | None, rows: dict[str, FlowNodeRun]) -> None:
    scope = _scope(run, rows)
    if outcome == "succeeded":
        try:
            value = evaluate(flow.output, scope) if flow.output else scope["nodes"]
        except Exception as exc:
            value, outcome, failed_node = None, "failed", f"output ({exc})"
    reason = TerminalReason.FINAL_ANSWER if outcome == "succeeded" else TerminalReason.ERROR
    with transaction.atomic():
        now = timezone.now()
        error = "" if outcome == "succeeded" else f"node {failed_node} failed: {rows[failed_node].error if failed_node in rows else ''}"
        output = _text(value) if outcome == "succeeded" else ""
        events = [Event("run.finished", {"terminal_reason": reason.value, "output": _summary(output) or None,
                                          "reason": error or None})]
        erows = _append(run, events)
        changes = {"status": RunStatus.FINISHED, "terminal_reason": reason.value, "phase": "finished", "output": output,
                   "error": error, "finished_at": now, "lease_token": "", "lease_expires_at": None}
        Run.objects.filter(pk=run.pk).update(**changes)
        for k, v in changes.items():
            setattr(run, k, v)
        publish_after_commit(run, erows, run_summary(run))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
