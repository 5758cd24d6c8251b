"""Executes a flow run (issue #15): the database's node rows are the state; deciding, storing and executing are
apart (issue #52), as LangGraph keeps them apart (``pregel/_algo.py`` decides, ``_loop.py`` persists, ``_runner.py``
executes):

- **decide**: ``runtime/flow_plan.py``, pure: from the rows, what to skip, open, settle, start, hold, or how the
  flow ends (``runtime.flows.plan`` schedules the graph);
- **store**: ``flows/store.py``: the rows, locks and guards; ``flows/commit.py`` commits a node's completion;
- **execute**: ``flows/nodes/``, a module per node kind;
- **apply**: this module: :func:`advance` applies a decision, :func:`execute_node` and the inline waves run nodes.

A flow run is a :class:`agents.models.Run` whose version holds a graph. ``agents.services.execute_run`` takes the
run's lease and hands it here (``agents/flow_hook.py``, :func:`run_flow`); :func:`advance` then decides, under the
run's row lock, what the committed node rows allow: skipped nodes are written, ready nodes get a row ``running`` with
a lease (a token and an expiry) and their own Celery task (``flows.execute_node``) once the decision commits, so
parallel branches spread over workers; inline nodes run a wave at a time in the task that started them. A node runs
and commits its completion in ONE transaction with the next decision (``flows/commit.py``). The flow ends
(``run.finished``) when the plan says so.

Bounds: the definition's ``max_parallel`` per run and the tenant's bound on running work, its running nodes and agent
runs together (``agents/capacity.py``); ready nodes over it stay pending and the run says so once (``flow.throttled``);
they start when another node of the tenant finishes, or at the sweeper's next look at the run.

Durability: a node task heartbeats its node's lease and the run's lease expiry. A worker killed mid-node leaves a
``running`` row whose lease expires: the next :func:`advance` (another node's completion, or the sweeper re-enqueuing
the run) starts it again with a new token (``attempt`` + 1); a late duplicate of the old task finds its token gone
and does nothing. A ``done`` node is never started again. A tool node's call id is ``fl:<run>:<node>`` on every
attempt (:func:`call_id`, ``ToolContext.call_key``), so the gateway's exactly-once guard for write tools finds a
restarted write's ``started`` row whatever the run's step is by then: a non-idempotent write is not sent again, its
outcome is unknown and the completion marks the run for an operator (``agents/attention.py``).

Locks: the run's row, its tenant's (``FOR NO KEY UPDATE``), the tenant's audit chain head, in that order (the one
order of ``audit/chain.py``; ``flows.store.lock``). A completion or decision that loses a deadlock or serialization
failure anyway is made again (``core/conflicts.py``): the nodes' work is kept, never turned into a failed run.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import capacity
from agents.engine import session_grants
from agents.lease import LeaseHeartbeat
from agents.models import Run, RunStatus
from agents.services import finish_without_worker
from audit.unit_of_work import StepAudit
from core.conflicts import retried
from flows import commit, nodes, store
from flows.commit import Done
from flows.models import FlowNodeRun, NodeStatus
from flows.nodes import Wave, approval
from flows.nodes import tool as tool_node
from flows.store import Writes, flow_input, version_definition
from runtime import flow_plan
from runtime.flow_plan import Decision, call_id
from runtime.flows import FlowDefinition, split_item_node_id
from runtime.types import Event, TerminalReason

__all__ = ["Done", "Wave", "Writes", "advance", "call_id", "execute_node", "flow_input", "run_flow", "version_definition"]

log = logging.getLogger(__name__)


def _grace() -> float:
    """A node's lease outlives its timeout by this much before it counts as dead."""
    return float(settings.FLOW_NODE_LEASE_GRACE_SECONDS)


def run_flow(run: Run, token: str) -> bool:
    """The registered runner: ``execute_run`` holds the run's lease; advance the flow (its node tasks do the rest).
    True when the run ended here, in this thread (an inline flow's last wave): its end committed with its lease given
    back, so the caller has no lease to release."""
    outer = getattr(_ended, "runs", None)  # a flow run in this thread's flow run (eager tasks): each watches its own
    _ended.runs = set()
    try:
        retried(lambda: advance(run.pk), what=f"flow run {run.pk}'s next step")
        return str(run.pk) in _ended.runs
    finally:
        _ended.runs = outer


def _ended_here(run_id: str) -> None:
    """The end of ``run_id`` committed in this thread: :func:`run_flow`, if it is running here, hears of it."""
    runs = getattr(_ended, "runs", None)
    if runs is not None:
        runs.add(run_id)


_ended = threading.local()


# -- applying a decision ----------------------------------------------------------------------------------------


def advance(run_id: Any, *, savepoint: bool = True, pending: list[Event] | None = None,
            writes: Writes | None = None) -> list[tuple[str, str]]:
    """Decide the flow's next step from its committed rows and apply it; returns the ``(node, token)`` pairs it
    started.

    The node tasks are enqueued when this transaction commits (inline nodes are run by :func:`_drive` then); tests may
    call :func:`execute_node` themselves. ``savepoint=False``: inside a transaction that fails as a whole.
    ``pending``: events of completions committed in the same transaction (an inline wave's), written first.
    ``writes``: the completions' own writes, their run locked and rows read under that lock (``flows/commit.py``);
    the decision's writes join them, and all go out together at the end.
    """
    with transaction.atomic(savepoint=savepoint):
        if writes is None:
            run = store.locked_flow_run(run_id)
            writes = Writes(run, store.rows(run.pk))
        run = writes.run
        if pending:
            store.publish(run, pending, writes)
        if run.status != RunStatus.RUNNING:
            writes.flush()
            return []
        if run.cancel_requested:
            writes.flush()
            finish_without_worker(run, TerminalReason.CANCELLED, "cancelled")
            return []
        flow, now = store.definition(run), timezone.now()
        decision = _decide(writes, flow, now, _settle_waiting(writes, flow, now))
        if decision.outcome is not None:
            _end(writes, flow, decision, now)
            return []
        return _start(writes, flow, decision, now)


def _settle_waiting(writes: Writes, flow: FlowDefinition, now: Any) -> set[str]:
    """Waiting nodes whose person decided (or whose child run ended) settled; the ids of those to run again."""
    if not any(r.status == NodeStatus.WAITING for r in writes.rows.values()):
        return set()
    writes.flush()
    run = writes.run
    redo = approval.decided(run, flow, store.rows(run.pk), now)  # the rows as committed, with their ids
    writes.rows = store.rows(run.pk)  # some may have finished: read them again
    return redo


def _decide(writes: Writes, flow: FlowDefinition, now: Any, redo: set[str]) -> Decision:
    """The plan's decision once its bookkeeping (skips, maps opened and settled) is written, the rows read again after
    each."""
    run, given = writes.run, flow_input(writes.run)
    while True:
        decision = flow_plan.decide(flow, writes.rows, flow_input=given, now=now, redo=redo)
        if decision.bookkeeping is None and not decision.maps_running:
            return decision
        writes.flush()
        if decision.bookkeeping is None:
            return decision
        store.write_bookkeeping(run, writes.rows, decision.bookkeeping, now)
        writes.rows = store.rows(run.pk)


def _end(writes: Writes, flow: FlowDefinition, decision: Decision, now: Any) -> None:
    run = writes.run
    if decision.failed_node:  # a map cut short by another node's failure: it started no more items
        writes.flush()
        store.stop_maps(run, decision.failed_node, now)
    store.finish(writes, flow_plan.ending(flow, decision, writes.rows, flow_input=flow_input(run)), now)
    run_id = str(run.pk)
    transaction.on_commit(lambda: _ended_here(run_id))  # once it is committed: see run_flow
    writes.flush(final=True)


def _start(writes: Writes, flow: FlowDefinition, decision: Decision, now: Any) -> list[tuple[str, str]]:
    """Start what the bounds admit: approval nodes ask, the others get their rows and leases; then the run waits for
    a person or keeps its lease, and the started nodes are handed to tasks or run inline once this commits."""
    run = writes.run
    bound = capacity.bound(run.tenant)
    busy = _busy(writes, flow, decision, now, bound) if decision.wants_to_start else 0
    admission = flow_plan.admit(flow, decision, bound=bound, busy=busy)
    given = flow_input(run)
    starts = flow_plan.starts(flow, writes.rows, admission, flow_input=given, grace=_grace())
    events = _ask(writes, flow, admission.asks, given, now)
    store.write_starts(writes, starts, now)
    events += [s.event() for s in starts]
    started = [(s.node_id, s.token) for s in starts]
    throttled = flow_plan.throttled(admission, decision, started=bool(started), bound=bound)
    if throttled is not None:
        events.append(throttled)
    if events:
        store.publish(run, events, writes)
    if flow_plan.waits(decision, admission, started=bool(started)):
        writes.flush()
        store.wait(run)
    else:
        store.keep_lease(writes, now)
    writes.flush(final=True)
    if started:
        _dispatch(run, flow, started, writes)
    return started


def _busy(writes: Writes, flow: FlowDefinition, decision: Decision, now: Any, bound: int) -> int:
    """The tenant's running work: this run's live nodes and the others', counted now that the tenant is locked unless
    the start only hands on the places this transaction's completions freed."""
    own = flow_plan.own_live(writes.rows, decision.view.stale, now)
    others = flow_plan.handed_over(flow, decision, own, freed=writes.freed, bound=bound)
    if others is None:
        if writes.guard is not None:  # counting needs the tenant's lock
            raise store.Unguarded("the tenant's running nodes must be counted")
        others = store.tenant_running_elsewhere(writes.run, now)
    return others + own


def _ask(writes: Writes, flow: FlowDefinition, asks: tuple[str, ...], given: Any, now: Any) -> list[Event]:
    """Approval nodes: a person, not a task; each waits for its request."""
    if not asks:
        return []
    writes.flush()
    scope = flow_plan.scope(given, writes.rows)
    return [approval.ask(writes.run, flow.node(nid), writes.rows, scope, now) for nid in asks]


def _dispatch(run: Run, flow: FlowDefinition, started: list[tuple[str, str]], writes: Writes) -> None:
    """Once the decision commits: a task per started node, or this thread runs the inline ones (:func:`_drive`)."""
    run_id = str(run.pk)
    inline = [(n, t) for n, t in started if flow.runs_inline(n)]
    tasks = [(n, t) for n, t in started if not flow.runs_inline(n)]
    if tasks:
        transaction.on_commit(lambda: _enqueue(run_id, tasks))
    if inline:
        transaction.on_commit(lambda: _drive(run_id, inline, writes))


def _enqueue(run_id: str, started: list[tuple[str, str]]) -> None:
    from flows.tasks import execute_node_task

    for node_id, token in started:
        try:
            execute_node_task.delay(run_id, node_id, token)
        except Exception:  # the broker is down: the node's lease expires and the sweeper's advance restarts it
            log.warning("flow run %s: node %s not enqueued; it restarts when its lease expires", run_id, node_id,
                        exc_info=True)


# -- running nodes ----------------------------------------------------------------------------------------------


def execute_node(run_id: Any, node_id: str, token: str) -> None:
    """Run one started node and commit its completion; a duplicate or stale task (its token gone) does nothing."""
    # one read: this node's row with its run (a tool or agent node's inputs were evaluated when it started: its own
    # row is all it reads); a node whose conditions or prompts see earlier outputs reads the run's rows too
    row = store.node_with_run(run_id, node_id)
    if row is None:
        log.info("flow run %s: node %s has nothing to run (the run or its row is gone)", run_id, node_id)
        return
    run = row.run
    flow = store.definition(run)
    rows: dict[str, FlowNodeRun] = {node_id: row}
    if not flow_plan.reads_only_itself(flow, node_id):
        rows = store.rows(run_id)
        row = rows.get(node_id)
    if row is None or not row.lease_token or row.lease_token != token or row.status != NodeStatus.RUNNING:
        log.info("flow run %s: node %s is not this task's to run (finished, or restarted by another)", run_id, node_id)
        return
    node, scope = flow_plan.node_and_scope(flow, node_id, flow_input(run), rows)
    audit, trace = StepAudit(), []  # the node's model and tool call events, committed with its completion
    lease = node.timeout_seconds + _grace()
    with LeaseHeartbeat(lambda: store.renew(run_id, node_id, token, lease), interval=max(0.5, min(_grace() / 3, 10.0))):
        status, output, chosen, error = nodes.attempts(run, flow, node, row, scope, audit, trace,
                                                       item=split_item_node_id(node_id) is not None)
    commit.complete(run, [Done(row.node_id, token, node.kind, audit, trace, status, output, chosen, error)])


_driving = threading.local()


def _drive(run_id: str, started: list[tuple[str, str]], writes: Writes | None = None) -> None:
    """Run inline nodes a wave at a time in this thread: each wave's completions and the next decision commit in one
    transaction, whose own inline nodes join the queue here (a loop, not a recursion, however long the graph).
    ``writes``: the transaction that started the wave; its run and rows are where the wave starts from."""
    queue = getattr(_driving, "queue", None)
    if queue is not None:  # already driving in this thread (the next wave, decided inside a wave): queue it
        queue.append((run_id, started, writes))
        return
    _driving.queue = [(run_id, started, writes)]
    try:
        while _driving.queue:
            rid, wave, last = _driving.queue.pop(0)
            try:
                _run_wave(rid, wave, last)
            except Exception:  # the nodes keep their leases: when they expire, the sweeper's advance starts them again
                log.exception("flow run %s: an inline wave failed; its nodes restart when their leases expire", rid)
    finally:
        _driving.queue = None


def _run_wave(run_id: Any, wave: list[tuple[str, str]], last: Writes | None = None) -> None:
    """A wave of inline nodes: run them (their tool calls side by side, ``tool.start_wave``), then commit all their
    completions (rows, events, audit) and advance the flow in ONE transaction (``commit.complete``). The run and node
    rows are those the transaction that started the wave left (``last``): read from the database only when there is
    none. A node whose lease was taken meanwhile (restarted elsewhere) is dropped at the commit, as in
    :func:`execute_node`."""
    run = last.run if last is not None else store.flow_run(run_id)
    rows = last.rows if last is not None else store.rows(run_id)
    context = last.wave if last is not None else None  # what the run's earlier waves in this thread resolved
    if context is None:
        flow = store.definition(run)
        context = Wave(flow, tool_node.flow_tools(run, flow), session_grants(run))
    context.checked.clear()  # the kill switch is read again for every wave
    flow = context.flow
    scope = flow_plan.scope(flow_input(run), rows)
    todo = [(row, token, flow.node(node_id), StepAudit(), [])
            for node_id, token in wave
            if (row := rows.get(node_id)) is not None and row.lease_token == token and row.status == NodeStatus.RUNNING]
    started = tool_node.start_wave(run, flow, todo, context)
    done = [Done(row.node_id, token, node.kind, audit, trace,
                 *nodes.attempts(run, flow, node, row, scope, audit, trace, wave=context, started=started.get(row.node_id)),
                 inline=True)
            for row, token, node, audit, trace in todo]
    context.fresh = False
    if done:
        commit.complete(run, done, last, context)
