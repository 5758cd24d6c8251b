"""A flow run's rows, locks and guards: every read and write of its node rows and its run's row the runner makes, and
the only place that knows which database it runs on (issue #52: decide, store, execute).

Locks: the run's row, its tenant's (``FOR NO KEY UPDATE``), the tenant's audit chain head, in that order (the one
order of ``audit/chain.py``; :func:`lock`). The writes of one transaction are sent together when it ends
(:class:`Writes`, ``core/batch.py``: one statement on PostgreSQL); a guarded commit sends them as ONE statement
that writes only if the run is as the last commit left it (:func:`guard`). Raw statements are built here from the
models' metadata, their names quoted by the database backend, every value a parameter.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from functools import cache, lru_cache
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from agents.models import Agent, AgentKind, Run, RunEvent, RunStatus
from agents.store import event_rows, guard_sql, publish_after_commit, run_summary
from audit.masking import mask_text
from audit.models import AuditChainHead
from core.batch import WriteBatch
from flows.models import FlowNodeRun, NodeStatus
from runtime.flow_plan import Bookkeeping, Ending, Start, summary
from runtime.flows import FlowDefinition
from runtime.types import Event, TerminalReason
from tenants.models import Tenant

# -- reads ------------------------------------------------------------------------------------------------------


def flow_input(run: Run) -> Any:
    try:
        return json.loads(run.input)
    except ValueError:
        return run.input


def definition(run: Run) -> FlowDefinition:
    return version_definition(run.version)


def version_definition(version: Any) -> FlowDefinition:
    """A flow version's graph, validated once per loaded version (a task's, an inline driver's for all its waves, a
    replay's) and once per process for the same document (the many node tasks of one version's runs)."""
    flow = getattr(version, "_flow_definition", None)
    if flow is None:
        flow = _parsed(json.dumps(version.definition, sort_keys=True, default=str))
        version._flow_definition = flow
    return flow


@lru_cache(maxsize=64)
def _parsed(document: str) -> FlowDefinition:
    """Keyed by the document itself, not the version's id: whatever happens to a version, a changed graph is parsed
    again. The result is shared: treat it as read-only (the runner does)."""
    return FlowDefinition.model_validate(json.loads(document))


def as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def rows(run_id: Any) -> dict[str, FlowNodeRun]:
    """The run's node rows by node id (by id: no join for the model's default order)."""
    return {r.node_id: r for r in FlowNodeRun.objects.filter(run_id=as_uuid(run_id)).order_by("id")}


def node_with_run(run_id: Any, node_id: str) -> FlowNodeRun | None:
    return FlowNodeRun.objects.select_related("run__tenant", "run__agent", "run__version", "run__session").filter(
        run_id=as_uuid(run_id), node_id=node_id).first()


def flow_run(run_id: Any) -> Run:
    return Run.objects.select_related("tenant", "agent", "version", "session").get(pk=as_uuid(run_id))


def locked_flow_run(run_id: Any) -> Run:
    """The run, its row and its tenant's locked as :func:`lock` takes them (not the agent's, ...)."""
    run = Run.objects.select_for_update(of=("self", "tenant"), no_key=True).select_related(
        "tenant", "agent", "version", "session").get(pk=as_uuid(run_id))
    run._locked_row = True  # append() need not lock and read it again
    return run


# -- the transaction's writes -----------------------------------------------------------------------------------


def append(run: Run, events: list[Event]) -> list[RunEvent]:
    """Write events at the run's next seqs, one step (locks the run's row until the caller's transaction ends; a run
    that the runner locked and read is not read again)."""
    if not getattr(run, "_locked_row", False):
        locked = Run.objects.select_for_update().only("last_seq", "step").get(pk=run.pk)
        run.last_seq, run.step = locked.last_seq, locked.step
    writes = Writes(run, {})
    rows = writes.append(events)
    writes.flush()
    return rows


def publish(run: Run, events: list[Event], writes: Writes | None = None) -> None:
    """Append events (to ``writes`` when given, else at once) and publish them once the transaction commits."""
    erows = writes.append(events) if writes is not None else append(run, events)
    publish_after_commit(run, erows, run_summary(run))


class Unguarded(Exception):
    """A guarded commit that wrote nothing: its transaction is rolled back, and the completions commit the locked
    way. ``contended``: its guard found the run changed by another writer (not a decision that needed more than one
    statement)."""

    def __init__(self, why: str, *, contended: bool = False) -> None:
        super().__init__(why)
        self.contended = contended


class Writes:
    """The writes of one decision's transaction, sent together when it ends (``core/batch.py``: one statement on
    PostgreSQL): nodes' completions and starts, their audit rows, the run's events and its own row. The run's
    counters (``last_seq``, ``step``) are kept on the locked run in memory and written once.

    ``flush`` sends what is pending. Call it before anything reads the node rows again or writes through the ORM
    (the rarer paths: approvals, skips, maps, the end of a run), so nothing reads around a pending write and no row
    is changed twice in one statement.
    """

    def __init__(self, run: Run, rows: dict[str, FlowNodeRun]) -> None:
        self.run, self.rows = run, rows
        self.batch = WriteBatch()
        self._run_changes: dict[str, Any] = {}
        self.left_seq: int | None = None  # the run's last event when this transaction's writes went out
        self.wave: Any = None  # the inline waves' shared context (flows.nodes.Wave) the next wave starts from
        #: nodes this transaction's completions took out of the running (their leases were alive): places a
        #: decision in the same transaction may hand on without counting the tenant's nodes
        self.freed = 0
        #: ``(sql, params)``: no lock was taken; the writes go out as ONE statement that writes only if this guard
        #: finds the run as the last commit left it (:func:`guard`)
        self.guard: tuple[str, list[Any]] | None = None

    def append(self, events: list[Event]) -> list[RunEvent]:
        """The events at the run's next seqs, one step (what :func:`append` sends at once)."""
        run = self.run
        rows = event_rows(run, run.last_seq + 1, run.step, events)
        self.batch.insert(RunEvent, rows)
        run.last_seq, run.step = run.last_seq + len(rows), run.step + 1
        self._run_changes.update(last_seq=run.last_seq, step=run.step)
        return rows

    def update_run(self, **changes: Any) -> None:
        for name, value in changes.items():
            setattr(self.run, name, value)
        self._run_changes.update(changes)

    def update_node(self, match: dict[str, Any], row: FlowNodeRun, fields: dict[str, Any]) -> None:
        """A node row's update (matched on ``match``), joined to the others, and the row in memory as it will be."""
        self.batch.update_where(FlowNodeRun, {"run_id": self.run.pk, **match}, **fields)
        for name, value in fields.items():
            setattr(row, name, value)

    def flush(self, *, final: bool = False) -> None:
        """``final``: the transaction's last writes (a guarded transaction may send only those, see ``guard``)."""
        if self.guard is not None and not final:
            raise Unguarded("a decision that writes more than its one statement")
        if self._run_changes:
            self.batch.update_where(Run, {"id": self.run.pk}, **self._run_changes)
            self._run_changes = {}
        if self.guard is not None:
            guard, self.guard = self.guard, None
            if not self.batch.can_guard():
                raise Unguarded("writes the guarded statement cannot hold")
            if self.batch.execute_guarded(*guard) is None:
                raise Unguarded("another writer came between", contended=True)  # nothing was written
        else:
            self.batch.execute()
        self.left_seq = self.run.last_seq


# -- locks and guards -------------------------------------------------------------------------------------------

#: The run's fields that change while it runs: refreshed in place by :func:`lock`.
_LOCKED = ("status", "cancel_requested", "last_seq", "step", "usage", "phase", "lease_token")


def one_statement_commits() -> bool:
    """Whether the database takes a commit's locks and writes in one statement each (PostgreSQL: a guarded commit, the
    run, tenant and chain head locked together); elsewhere every commit locks through the ORM first."""
    return connection.vendor == "postgresql"


@cache
def _lock_sql(with_head: bool) -> str:
    """The run's row and its tenant's (the tenant's node bound is decided under it) and, for a commit with audit rows,
    the tenant's audit chain head, locked and read in one statement. The tenant's running nodes are NOT counted here:
    this statement reads other tables with the snapshot it took before it waited for the locks, so a count here would
    miss the nodes that a transaction holding the tenant's lock started meanwhile, and the tenant's bound would be
    exceeded (:func:`tenant_running_elsewhere` counts after the lock)."""
    q = connection.ops.quote_name
    run, tenant, head = Run._meta, Tenant._meta, AuditChainHead._meta
    tenant_col = q(run.get_field("tenant").column)
    columns = ", ".join(f"r.{q(run.get_field(name).column)}" for name in _LOCKED)
    sql = f"SELECT {columns}"
    if with_head:
        sql += f', h.{q(head.get_field("seq").column)}, h.{q(head.get_field("hash").column)}'
    sql += f" FROM {q(run.db_table)} r JOIN {q(tenant.db_table)} t ON t.{q(tenant.pk.column)} = r.{tenant_col}"
    if with_head:
        sql += f" JOIN {q(head.db_table)} h ON h.{q(head.pk.column)} = r.{tenant_col}"
    # The lock order of audit/chain.py: run, tenant, chain head (locked in that order, the order of the join).
    # NO KEY UPDATE: exclusive against another flow's lock of the same rows, yet no wait for (nor of) the KEY SHARE
    # lock a foreign-key check of a row that references them takes; an agent step holding the chain head checks its
    # audit rows' keys to the tenant at commit: FOR UPDATE here made the two wait for each other (deadlock detected).
    return sql + f" WHERE r.{q(run.pk.column)} = %s FOR NO KEY UPDATE OF r, t" + (", h" if with_head else "")


def lock(run: Run, *, with_head: bool) -> tuple[bool, AuditChainHead | None]:
    """Lock the run (and its tenant, and the audit chain head when asked) and refresh the run's changing fields in
    place: ``(found, head)``. One statement on PostgreSQL once the head exists; elsewhere the run here and the head
    by the audit's own lock."""
    if not one_statement_commits():
        values = Run.objects.select_for_update().filter(pk=run.pk).values(*_LOCKED).first()
        if values is None:
            return False, None
        _refresh(run, values)
        return True, None
    for head_too in ((True, False) if with_head else (False,)):  # a tenant's first audit row: no head yet
        with connection.cursor() as cursor:
            cursor.execute(_lock_sql(head_too), [run.pk])
            found = cursor.fetchone()
        if found is None:
            continue
        values = dict(zip(_LOCKED, found[: len(_LOCKED)], strict=True))
        if isinstance(values["usage"], str):
            values["usage"] = json.loads(values["usage"])
        _refresh(run, values)
        return True, AuditChainHead(tenant_id=run.tenant_id, seq=found[-2], hash=found[-1]) if head_too else None
    return False, None


def _refresh(run: Run, values: dict[str, Any]) -> None:
    for name, value in values.items():
        setattr(run, name, value)
    run._locked_row = True


@cache
def _running_elsewhere_sql() -> str:
    """The tenant's live nodes in its other runs plus its agent runs a worker executes (``agents.capacity.running_runs``:
    a live lease, not a flow run), in one statement."""
    q = connection.ops.quote_name
    node, run, agent = FlowNodeRun._meta, Run._meta, Agent._meta
    column = {name: q(node.get_field(name).column) for name in ("tenant", "status", "lease_expires_at", "run")}
    on_run = {name: q(run.get_field(name).column) for name in ("tenant", "status", "lease_token", "lease_expires_at", "agent")}
    return (f'SELECT (SELECT count(*) FROM {q(node.db_table)} WHERE {column["tenant"]} = %s '  # noqa: S608
            f'AND {column["status"]} = %s AND {column["lease_expires_at"]} >= %s AND {column["run"]} <> %s) + '
            f'(SELECT count(*) FROM {q(run.db_table)} r JOIN {q(agent.db_table)} a ON a.{q(agent.pk.column)} = '
            f'r.{on_run["agent"]} WHERE r.{on_run["tenant"]} = %s AND r.{on_run["status"]} = %s '
            f"AND r.{on_run['lease_token']} <> '' AND r.{on_run['lease_expires_at']} >= %s "
            f'AND a.{q(agent.get_field("kind").column)} <> %s)')


def tenant_running_elsewhere(run: Run, now: dt.datetime) -> int:
    """The tenant's running work but this run's nodes: its nodes running (lease alive) in its other runs and its agent
    runs (they share the bound, agents/capacity.py). A statement of its own, made after the tenant's row is locked
    (see :func:`_lock_sql`). Its text is fixed (a prepared statement on PostgreSQL): building and compiling the ORM's
    count took more CPU than PostgreSQL's answer (1.4 against 0.3 ms)."""
    at = FlowNodeRun._meta.get_field("lease_expires_at").get_db_prep_value(now, connection)
    run_id = Run._meta.pk.get_db_prep_value(run.pk, connection)
    with connection.cursor() as cursor:
        cursor.execute(_running_elsewhere_sql(), [run.tenant_id, NodeStatus.RUNNING.value, at, run_id,
                                                  run.tenant_id, RunStatus.RUNNING.value, at, AgentKind.FLOW.value])
        found = cursor.fetchone()
    return int(found[0]) if found else 0


#: The wave's guard (``agents.store.guard_sql``): the run still running, uncancelled, its events and step where the
#: commit before the wave left them.
_WAVE_GUARD = ("last_seq", "step", "status")


def guard(writes: Writes, head: AuditChainHead | None) -> None:
    """Make ``writes`` a guarded commit: its writes go out as one statement, only if the run (and the tenant's chain
    head) is as the commit before left it."""
    run = writes.run
    params: list[Any] = [run.pk, run.last_seq, run.step, RunStatus.RUNNING.value]
    sql = guard_sql(_WAVE_GUARD, with_head=head is not None, uncancelled=True)
    writes.guard = (sql, params + ([head.seq, head.hash] if head is not None else []))


def renew(run_id: Any, node_id: str, token: str, seconds: float) -> bool:
    """A running node's lease and its run's, renewed; False once the node is not this token's."""
    now = timezone.now()
    if not FlowNodeRun.objects.filter(run_id=run_id, node_id=node_id, lease_token=token,
                                      status=NodeStatus.RUNNING).update(lease_expires_at=now + dt.timedelta(seconds=seconds)):
        return False
    Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(
        lease_expires_at=now + dt.timedelta(seconds=settings.RUN_LEASE_SECONDS))
    return True


# -- node rows --------------------------------------------------------------------------------------------------


def write_bookkeeping(run: Run, rows: dict[str, FlowNodeRun], book: Bookkeeping, now: dt.datetime) -> None:
    """Skipped nodes, opened maps, settled maps (``runtime.flow_plan.Bookkeeping``) and their events, at once."""
    for nid in book.skip:
        FlowNodeRun.objects.update_or_create(run=run, node_id=nid, defaults={
            "tenant_id": run.tenant_id, "status": NodeStatus.SKIPPED, "finished_at": now})
    for o in book.opened:
        FlowNodeRun.objects.update_or_create(run=run, node_id=o.node_id, defaults={
            "tenant_id": run.tenant_id, "kind": "map", "status": NodeStatus.FAILED if o.error else NodeStatus.RUNNING,
            "attempt": 1, "inputs": {"items": o.items}, "span_id": o.span_id, "started_at": now, "error": o.error,
            "output": o.output, "lease_token": "", "lease_expires_at": None, "finished_at": now if o.error else None})
    for s in book.settled:
        FlowNodeRun.objects.filter(pk=rows[s.node_id].pk).update(status=s.status, output=s.output, error=s.error,
                                                                 finished_at=now)
    publish(run, book.events())


def stop_maps(run: Run, failed_node: str, now: dt.datetime) -> None:
    """Running maps cut short by another node's failure: they started no more items."""
    FlowNodeRun.objects.filter(run=run, kind="map", status=NodeStatus.RUNNING).update(
        status=NodeStatus.FAILED, error=f"stopped: node {failed_node} failed", finished_at=now)


def write_starts(writes: Writes, starts: list[Start], now: dt.datetime) -> None:
    """Started nodes' rows: ``running`` with their lease; first starts in one INSERT (a fan-out starts ten at once),
    restarts (a dead worker's node, a waiting tool node run again with its approval's decision) updated."""
    run, rows = writes.run, writes.rows
    fresh: list[FlowNodeRun] = []
    for s in starts:
        fields = {"tenant_id": run.tenant_id, "kind": s.kind, "status": NodeStatus.RUNNING, "attempt": s.attempt,
                  "inputs": s.inputs, "span_id": s.span_id, "started_at": now, "lease_token": s.token,
                  "lease_expires_at": now + dt.timedelta(seconds=s.lease_seconds)}
        row = rows.get(s.node_id)
        if row is None:
            rows[s.node_id] = FlowNodeRun(run=run, node_id=s.node_id, **fields)
            fresh.append(rows[s.node_id])
        else:
            writes.update_node({"node_id": s.node_id}, row, fields)
    writes.batch.insert(FlowNodeRun, fresh)  # the run's row lock orders this against any other decision


def complete_node(writes: Writes, row: FlowNodeRun, token: str, status: str, output: Any, chosen: list[str], error: str,
                  now: dt.datetime) -> None:
    """A node's completion, on its row only while its lease is this token's."""
    fields = {"status": status, "output": output, "chosen": chosen, "error": error, "lease_token": "",
              "lease_expires_at": None, "finished_at": None if status == NodeStatus.WAITING else now}
    writes.update_node({"node_id": row.node_id, "lease_token": token, "status": NodeStatus.RUNNING}, row, fields)


def mark_waiting(run: Run, node: Any, inputs: dict[str, Any], span: str, now: dt.datetime) -> FlowNodeRun:
    """An approval node waits for a person (no lease)."""
    row, _ = FlowNodeRun.objects.update_or_create(run=run, node_id=node.id, defaults={
        "tenant_id": run.tenant_id, "kind": node.kind, "status": NodeStatus.WAITING, "attempt": 1, "inputs": inputs,
        "span_id": span, "started_at": now, "lease_token": "", "lease_expires_at": None})
    return row


def settle_waiting(row: FlowNodeRun, *, approved: bool, output: Any, error: str, now: dt.datetime) -> None:
    """A waiting node's person decided."""
    FlowNodeRun.objects.filter(pk=row.pk, status=NodeStatus.WAITING).update(
        status=NodeStatus.DONE if approved else NodeStatus.FAILED, output=output, error=error, finished_at=now)


def waiting_children_ended(rows: dict[str, FlowNodeRun]) -> set[str]:
    """Agent nodes waiting for a child run that paused for a person, once the child ended."""
    children = {r.child_run_id: nid for nid, r in rows.items()
                if r.status == NodeStatus.WAITING and r.kind == "agent" and r.child_run_id is not None}
    if not children:
        return set()
    ended = Run.objects.filter(pk__in=list(children), status=RunStatus.FINISHED).values_list("pk", flat=True)
    return {children[pk] for pk in ended}


# -- the run's row ----------------------------------------------------------------------------------------------


def finish(writes: Writes, end: Ending, now: dt.datetime) -> None:
    """The run ends: its answer or error (masked: the rule of the trace and of agents' answers), ``run.finished``, its
    lease given back."""
    reason = TerminalReason.FINAL_ANSWER if end.succeeded else TerminalReason.ERROR
    error = mask_text(end.error) if not end.succeeded else ""
    output = mask_text(end.output) if end.succeeded else ""
    events = [Event("run.finished", {"terminal_reason": reason.value, "output": summary(output) or None,
                                      "reason": error or None})]
    erows = writes.append(events)
    writes.update_run(status=RunStatus.FINISHED, terminal_reason=reason.value, phase="finished", output=output,
                      error=error, finished_at=now, lease_token="", lease_expires_at=None)
    publish_after_commit(writes.run, erows, run_summary(writes.run))


def wait(run: Run) -> None:
    """Nothing can run until a person decides: the run waits (no lease), its worker is free."""
    rows = append(run, [Event("state.transition", {"from": "running", "to": "waiting"})])
    Run.objects.filter(pk=run.pk).update(status=RunStatus.WAITING, phase="waiting", lease_token="", lease_expires_at=None)
    run.status = RunStatus.WAITING
    publish_after_commit(run, rows, run_summary(run))


def keep_lease(writes: Writes, now: dt.datetime) -> None:
    """Nodes in flight (or held): the run's lease expiry follows them, the node tasks renew it."""
    writes.update_run(lease_expires_at=now + dt.timedelta(seconds=settings.RUN_LEASE_SECONDS))


def node_row(run: Run, node_id: str) -> FlowNodeRun:
    return FlowNodeRun.objects.get(run=run, node_id=node_id)


def link_child(row: FlowNodeRun, child: Run, facts: dict[str, Any]) -> None:
    """An agent node's child run: its facts name the flow run, the node's row names it."""
    Run.objects.filter(pk=child.pk).update(facts=facts)
    FlowNodeRun.objects.filter(pk=row.pk).update(child_run=child)


def attention_reasons(run: Run) -> Any:
    """The run's reasons for an operator's attention as committed (read under its lock)."""
    return Run.objects.filter(pk=run.pk).values_list("attention_reasons", flat=True).first()
