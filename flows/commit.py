"""Committing finished nodes: their rows, sealed audit rows, trace events and usage, and the flow's next decision
(``flows.runner.advance``), in ONE transaction. If any of it fails nothing is committed: the nodes keep their
leases and run again when those expire.

The locked way (:func:`complete`): under the run's lock (one statement with the tenant's audit chain head,
``flows.store.lock``) the node rows are read once; a node whose lease was taken meanwhile (restarted elsewhere) is
dropped. A completion that loses a deadlock or a serialization failure is made again (``core/conflicts.py``): the
nodes' work is kept, never turned into a failed run.

An inline wave's completions may first try :func:`complete_guarded`: no lock taken first, the writes go out as one
statement that writes only if the run is still as the wave's own transaction left it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents import attention
from agents.models import Run
from audit.models import AuditChainHead
from audit.unit_of_work import StepAudit, forget_keys
from core.conflicts import is_conflict, retried
from flows import store
from flows.models import FlowNodeRun, NodeStatus
from flows.nodes import Wave
from runtime.flow_plan import summary
from runtime.types import Event, Usage

log = logging.getLogger(__name__)


@dataclass
class Done:
    """A node that ran (its retries included), to be committed: ``(status, output, chosen, error)`` and what it
    left: its audit rows and its trace (model and tool call events)."""

    node_id: str
    token: str
    kind: str
    audit: StepAudit
    trace: list[Event]
    status: str
    output: Any
    chosen: list[str]
    error: str
    inline: bool = False

    def event(self, span_id: str) -> Event:
        """``flow.node.finished`` (``flow.node.waiting`` for a node that waits for a person)."""
        payload: dict[str, Any] = {"node": self.node_id, "kind": self.kind, "status": str(self.status),
                                   "output": summary(self.output)}
        if self.inline:
            payload["inline"] = True
        if self.error:
            payload["error"] = self.error
        if self.chosen:
            payload["chosen"] = self.chosen
        kind = "flow.node.waiting" if self.status == NodeStatus.WAITING else "flow.node.finished"
        return Event(kind, payload, parent_span_id=span_id)


def complete(run: Run, done: list[Done], last: store.Writes | None = None, wave: Wave | None = None) -> None:
    """Commit finished nodes and advance the flow, in ONE transaction.

    ``last``: the transaction that started these nodes (an inline wave's). Its rows are still the committed ones
    when nothing else wrote since: the run's event sequence is where it left it (every change of a node row but a
    task's lease renewal appends an event) and no node of the run runs in a task of its own (none renews a lease);
    then they are not read again, and the commit is first tried without the lock (:func:`complete_guarded`)."""
    if last is not None and wave is not None and _may_guard(run, done, last, wave):
        if _guarded(run, done, last, wave):
            return
        last = None  # the rows in memory went ahead of the database: read them again
    _locked(run, done, last, wave)


def _guarded(run: Run, done: list[Done], last: store.Writes, wave: Wave) -> bool:
    """The guarded try, in a real transaction around its one statement (a nested atomic(), a savepoint or on_commit
    hold): False when it wrote nothing (rolled back), so the completions commit the locked way."""
    head = wave.head
    try:
        with transaction.atomic():
            complete_guarded(run, done, last, wave)
        return True
    except store.Unguarded as why:  # rolled back, nothing written: the locked way, which reads what changed
        log.debug("flow run %s: the wave commits the locked way (%s)", run.pk, why)
        if why.contended:  # another writer: this run's later waves lock first
            wave.contended, wave.head = True, None
        else:  # nothing was sent: the head is as it was
            wave.head = head
    except Exception as exc:  # it lost a deadlock (nothing written): the locked way, as for another writer
        if not is_conflict(exc):
            raise
        wave.contended, wave.head = True, None
    return False


def _locked(run: Run, done: list[Done], last: store.Writes | None, wave: Wave | None) -> None:
    tries: list[int] = []

    def commit() -> None:
        nonlocal last
        if tries:  # the last try was rolled back: the rows and the head it had in memory are not the database's
            last = None
            for d in done:
                forget_keys(d.audit)
            if wave is not None:
                wave.contended, wave.head = True, None
        tries.append(1)
        with transaction.atomic():
            now = timezone.now()
            found, head = store.lock(run, with_head=any(len(d.audit) for d in done))
            if not found:
                return
            reuse = last is not None and run.last_seq == last.left_seq and not _tasks_running(run, last.rows)
            writes = store.Writes(run, last.rows if reuse and last is not None else store.rows(run.pk))
            _record(run, done, writes, head, now, wave)

    retried(commit, what=f"flow run {run.pk}'s completion of {', '.join(d.node_id for d in done)}")


def _tasks_running(run: Run, rows: dict[str, FlowNodeRun]) -> bool:
    """Whether a node of the run runs in a task of its own (which renews its lease without an event)."""
    return any(r.status == NodeStatus.RUNNING and not store.definition(run).runs_inline(nid) for nid, r in rows.items())


def _may_guard(run: Run, done: list[Done], last: store.Writes, wave: Wave) -> bool:
    """Whether an inline wave's completions may commit without locking first: the database commits in one statement,
    nothing else wrote to the run since the transaction that started the wave (as far as this thread knows; the guard
    checks it), and the tenant's audit chain head is known when there are audit rows to seal."""
    return (store.one_statement_commits() and not wave.contended and run.last_seq == last.left_seq
            and (wave.head is not None or not any(len(d.audit) for d in done)) and not _tasks_running(run, last.rows))


def complete_guarded(run: Run, done: list[Done], last: store.Writes, wave: Wave) -> None:
    """An inline wave's completions and the next decision with no lock taken first: decided from the run and rows the
    wave's own transaction left, they go out as ONE statement that writes only if the run's row (and the tenant's
    chain head, for audit rows) is still as that transaction left it, under their locks (the agent step's guarded
    commit, ``agents/store.py``). Only a decision that needs nothing more qualifies: one that would count the
    tenant's nodes (a start beyond a hand-over), settle approvals, skips or maps, or wait, raises
    ``store.Unguarded`` before anything is written, as does a guard that finds the run changed."""
    head = None
    if any(len(d.audit) for d in done):
        assert wave.head is not None
        head = AuditChainHead(tenant_id=run.tenant_id, seq=wave.head[0], hash=wave.head[1])
    writes = store.Writes(run, last.rows)
    store.guard(writes, head)
    _record(run, done, writes, head, timezone.now(), wave)
    if writes.guard is not None and writes.batch:  # a decision that returned before its last writes (cannot happen)
        raise store.Unguarded("writes left unsent")


def _record(run: Run, done: list[Done], writes: store.Writes, head: AuditChainHead | None, now: Any,
            wave: Wave | None) -> None:
    """The completions' writes (node rows, sealed audit rows, events, usage) into ``writes``, then the next decision
    (``flows.runner.advance``) in the same transaction, which sends them all."""
    from flows import runner  # the runner applies decisions and calls this module: imported when it has loaded

    writes.wave = wave  # the next wave of this run, in this thread, starts from it
    audit, events, calls = StepAudit(), [], []
    for d in done:
        row = writes.rows.get(d.node_id)
        if row is None or row.lease_token != d.token or row.status != NodeStatus.RUNNING:
            log.warning("flow run %s: node %s lost its lease before committing; its result is dropped", run.pk, d.node_id)
            continue
        if row.lease_expires_at is not None and row.lease_expires_at >= now:
            writes.freed += 1  # a live node stops running here
        store.complete_node(writes, row, d.token, d.status, d.output, d.chosen, d.error, now)
        for write in d.audit:
            audit.add(write)
        events += [*d.trace, d.event(row.span_id)]
        calls += [e for e in d.trace if e.type == "model.call"]
    if not events:
        writes.guard = None  # nothing to write
        return
    events += _attention_marks(run, writes, audit, now)
    audit.commit(run.tenant_id, writes.batch, head)
    if wave is not None and head is not None:
        wave.head = (head.seq, head.hash)  # the chain's head once this commits (sealing moved it)
    if calls:  # the nodes' model calls into the run's usage (read under the lock), as spend reads it
        writes.update_run(usage=_with_calls(run.usage, calls).to_dict())
    # the next step in the same transaction: the completions and the next nodes' start commit together or not at all
    runner.advance(run.pk, savepoint=False, pending=events, writes=writes)


def _with_calls(usage: Any, calls: list[Event]) -> Usage:
    total = Usage.from_dict(usage)
    for call in calls:
        total = total + Usage(int(call.payload.get("input_tokens", 0)), int(call.payload.get("output_tokens", 0)),
                              float(call.payload.get("cost", 0.0)))
    return total


def _attention_marks(run: Run, writes: store.Writes, audit: StepAudit, now: Any) -> list[Event]:
    """A write whose outcome is unknown (a non-idempotent write found ``started`` by a retried node and not repeated,
    a write past its timeout) marks the run for an operator in the completion's transaction, as an agent step does
    (``agents/attention.py``): its reasons on the run's row, a ``run.needs_attention`` event each. Rare, so the locked
    way only: a guarded commit gives way (nothing written yet), and the run's reasons are read under its lock."""
    reasons = attention.reasons_for_writes(audit.pending, at=now)
    if not reasons:
        return []
    if writes.guard is not None:
        raise store.Unguarded("a completion that marks the run for an operator")
    writes.update_run(needs_attention=True, attention_reasons=attention.with_reasons(store.attention_reasons(run), reasons))
    spans = {w.started_pk: w.row.span_id for w in audit.pending if w.started_pk is not None and w.row.span_id}
    return attention.events_for(reasons, spans=spans)

