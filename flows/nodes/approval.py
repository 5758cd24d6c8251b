"""An approval node: one approval request (the approvers' page, rules and audit of tool approvals) with the rendered
``preview`` and the node's inputs; the node waits, and the run with it when nothing else runs. Once a person decided,
the node finishes (approved) or fails (rejected, expired, cancelled: its ``on_error`` decides). A tool node whose
call waits for an approval, and an agent node whose child run waits for one, are run again once it is decided."""

from __future__ import annotations

import datetime as dt
from typing import Any

from audit.masking import mask_text, mask_value
from flows import store
from flows.models import FlowNodeRun, NodeStatus
from runtime.flow_plan import call_id, summary
from runtime.flows import FlowDefinition, Node, node_arguments, render
from runtime.types import Event, new_span_id


def ask(run: Any, node: Node, rows: dict[str, FlowNodeRun], scope: dict[str, Any], now: dt.datetime) -> Event:
    """The node's approval request, announced to the tenant's channels as a tool's is; the node waits (its row, in
    ``rows`` too). Returns its ``flow.node.waiting`` event."""
    from approvals.decisions import publish
    from approvals.models import ApprovalRequest, NotifyEvent
    from approvals.tasks import enqueue_notice

    row = rows.get(node.id)
    try:
        inputs = node_arguments(node, scope)
        text = render(node.preview or f"Approve step {node.id} of flow {run.agent.slug}?", scope)
    except Exception as exc:
        inputs, text = {}, f"(the preview could not be built: {exc})"
    request, created = ApprovalRequest.objects.get_or_create(run_id=run.pk, call_id=call_id(run.pk, node.id), defaults={
        "tenant_id": run.tenant_id, "step": run.step, "tool": None, "tool_name": f"flow:{node.id}"[:64],
        "arguments": inputs, "arguments_hash": "", "required_approvals": 1,
        "preview": {"tool": f"flow {run.agent.slug}: {node.id}", "description": mask_text(text)[:300],
                    "text": mask_text(text)[:4000], "arguments": mask_value(inputs)},
        "approver_roles": list(node.approver_roles),
        "expires_at": now + dt.timedelta(seconds=node.expires_in_seconds)})
    publish(request)
    if created:  # announced to the tenant's channels as a tool's approval request is (the fault suite found none sent)
        enqueue_notice(request.pk, NotifyEvent.ARRIVED)
    span = row.span_id if row is not None and row.span_id else new_span_id()
    rows[node.id] = store.mark_waiting(run, node, inputs, span, now)
    return Event("flow.node.waiting", {"node": node.id, "kind": "approval", "approval_id": str(request.pk),
                                       "preview": summary(text)}, span_id=span)


def decided(run: Any, flow: FlowDefinition, rows: dict[str, FlowNodeRun], now: dt.datetime) -> set[str]:
    """Settle waiting nodes whose approval was decided: an approval node finishes or fails; the ids of the nodes to run
    again with the decision are returned (a tool node's call, an agent node whose child run ended)."""
    from approvals.models import ApprovalRequest, ApprovalStatus

    redo = store.waiting_children_ended(rows)
    waiting = {call_id(run.pk, nid): nid for nid, r in rows.items() if r.status == NodeStatus.WAITING and r.kind != "agent"}
    if not waiting:
        return redo
    requests = ApprovalRequest.objects.filter(run_id=run.pk, call_id__in=list(waiting)).exclude(status=ApprovalStatus.PENDING)
    events: list[Event] = []
    for request in requests.prefetch_related("decisions"):
        nid = waiting[request.call_id]
        node = flow.node(nid)
        if node.kind != "approval":
            redo.add(nid)
            continue
        events.append(_settle(node, rows[nid], request, approved=request.status == ApprovalStatus.APPROVED, now=now))
    if events:
        store.publish(run, events)
    return redo


def _settle(node: Node, row: FlowNodeRun, request: Any, *, approved: bool, now: dt.datetime) -> Event:
    """An approval node whose request was decided: its row and its ``flow.node.finished`` event."""
    notes = [d.note for d in request.decisions.all() if d.note]
    output = {"approved": approved, "status": request.status, "notes": notes}
    error = "" if approved else f"{request.status} by an approver" + (f": {notes[-1]}" if notes else "")
    if not approved and node.on_error == "continue":
        output["error"] = error
    store.settle_waiting(row, approved=approved, output=output, error=error, now=now)
    payload = {"node": node.id, "kind": "approval", "status": "done" if approved else "failed", "output": summary(output)}
    if error:
        payload["error"] = error
    return Event("flow.node.finished", payload, parent_span_id=row.span_id)
