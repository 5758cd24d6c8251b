"""An agent node: a child run of the tenant's agent, linked to the flow run (``facts.parent_run``, the row's
``child_run``); the node waits for it to end (at most its ``timeout_seconds``). A restarted node waits for the child
it started; a child that waits for a person frees the node's task (the node waits, and runs again once the child
ended: ``agents.services.resume_parent`` re-queues the flow run)."""

from __future__ import annotations

import json
import time
from typing import Any

from django.db import transaction

from agents.models import Agent, AgentKind, Run, RunStatus
from flows import store
from flows.nodes.base import Attempt, NodeFailed, NodeWaits
from runtime.types import Event, TerminalReason

#: How often the node looks at its child run (seconds).
POLL_SECONDS = 0.2


def run(a: Attempt) -> Any:
    from agents.services import execute_run

    row = store.node_row(a.run, a.node.id)
    child_id = row.child_run_id if row.child_run_id is not None else _start_child(a, row)
    # here if no worker took it yet (in the node's place: not admitted again); its lease decides, so a duplicate does nothing
    execute_run(str(child_id), in_place=True)
    done = _ended(a, child_id)
    if done.terminal_reason != TerminalReason.FINAL_ANSWER.value:
        raise NodeFailed(f"child run {child_id} of {a.node.agent!r} ended {done.terminal_reason}: {done.error or 'no answer'}")
    return {"answer": done.output, "child_run": str(child_id), "agent": a.node.agent}


def _start_child(a: Attempt, row: Any) -> Any:
    """The child run, created and linked to the node's row in one transaction: its id."""
    from agents.services import RunRefused, start_run
    from tenants.scoping import Actor

    run, node = a.run, a.node
    agent = Agent.objects.for_tenant(run.tenant_id).select_related("tenant").filter(slug=node.agent, kind=AgentKind.AGENT).first()
    if agent is None:
        raise NodeFailed(f"there is no agent {node.agent!r} in this tenant")
    text = a.inputs.get("input") if isinstance(a.inputs.get("input"), str) else json.dumps(a.inputs, ensure_ascii=False)
    try:
        with transaction.atomic():
            child = start_run(actor=Actor(user=run.created_by, api_key=run.api_key), agent=agent, text=text or "")
            facts = {**child.facts, "parent_run": str(run.pk), "parent_flow": run.agent.slug, "flow_node": node.id}
            store.link_child(row, child, facts)
    except RunRefused as exc:
        raise NodeFailed(f"the agent {node.agent!r} refused the request: {exc}") from None
    a.trace.append(Event("flow.child_run", {"node": node.id, "agent": node.agent, "child_run": str(child.pk)},
                         parent_span_id=a.span))
    return child.pk


def _ended(a: Attempt, child_id: Any) -> Run:
    """The child run once it finished; ``NodeWaits`` when it waits for a person, ``NodeFailed`` past the timeout."""
    deadline = time.monotonic() + a.node.timeout_seconds
    while (done := Run.objects.get(pk=child_id)).status != RunStatus.FINISHED:
        if done.status == RunStatus.WAITING:  # a person decides first: the node waits with its task (worker) freed
            raise NodeWaits(f"child run {child_id} of {a.node.agent!r} waits for an approval")
        if time.monotonic() > deadline:
            raise NodeFailed(f"timeout: child run {child_id} ({done.status}) did not end in {a.node.timeout_seconds:g}s")
        time.sleep(POLL_SECONDS)
    return done
