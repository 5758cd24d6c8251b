"""Executes a flow run (issue #15): the database's node rows are the state, :func:`runtime.flows.plan` the scheduler.

A flow run is a :class:`agents.models.Run` whose version holds a graph. ``agents.services.execute_run`` takes the run's
lease and hands it here (``agents/flow_hook.py``); :func:`advance` then decides, under the run's row lock, what the
committed node rows allow: skipped nodes are written, ready nodes get a row ``running`` with a lease (a token and an
expiry) and their own Celery task (``flows.execute_node``) once the decision commits, so parallel branches spread over
workers. A node task runs its node and commits its completion in ONE transaction (the row: status, output, error; its
trace events: a span per node, ``flow.node.started`` ... ``flow.node.finished``; its tool audit rows), then advances
the run again. The flow ends (``run.finished``) when the plan says so.

Bounds: the definition's ``max_parallel`` per run and the tenant's bound on running work, its running nodes and agent
runs together (``agents/capacity.py``: ``Tenant.max_running``, else ``TENANT_MAX_RUNNING``); ready nodes over it stay
pending and the run says so once (``flow.throttled``); they start when another node of the tenant finishes, or at the
sweeper's next look at the run.

Durability: a node task heartbeats its node's lease and the run's lease expiry. A worker killed mid-node leaves a
``running`` row whose lease expires: the next :func:`advance` (another node's completion, or the sweeper re-enqueuing
the run) starts it again with a new token (``attempt`` + 1); a late duplicate of the old task finds its token gone
and does nothing. A ``done`` node is never started again. A tool node's call id is ``flow:<run>:<node>`` on every
attempt (``ToolContext.call_key``), so the gateway's exactly-once guard for write tools finds a restarted write's
``started`` row whatever the run's step is by then: a non-idempotent write is not sent again, its outcome is
unknown and the completion marks the run for an operator (``agents/attention.py``).

Locks: the run's row, its tenant's (``FOR NO KEY UPDATE``), the tenant's audit chain head, in that order (the one
order of ``audit/chain.py``). A completion or decision that loses a deadlock or serialization failure anyway is
made again (``core/conflicts.py``): the nodes' work is kept, never turned into a failed run.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from jmespath.exceptions import JMESPathError

from agents import attention, capacity
from agents.engine import session_grants
from agents.hooks import callable_tools, resolvable_tools, tool_allowed_as_read, tool_allowed_for
from agents.lease import LeaseHeartbeat
from agents.models import Agent, AgentKind, Run, RunEvent, RunStatus
from agents.services import finish_without_worker
from agents.store import event_rows, guard_sql, publish_after_commit, run_summary
from approvals.gate import ApprovalGate
from audit.masking import mask_text, mask_value
from audit.models import AuditChainHead
from audit.unit_of_work import StepAudit, forget_keys
from core.batch import WriteBatch
from core.conflicts import is_conflict, retried
from flows.models import FlowNodeRun, NodeStatus
from runtime.flows import (
    MAP_MAX_ITEMS,
    BodyNode,
    FlowDefinition,
    Node,
    choose,
    evaluate,
    item_node_id,
    item_output,
    item_scope,
    node_arguments,
    plan,
    plan_map,
    render,
    split_item_node_id,
)
from runtime.types import Event, ModelRequest, TerminalReason, ToolCall, ToolContext, ToolStatus, Usage, new_span_id
from tenants.models import Tenant
from tools.gateway import PendingCall, ToolGateway

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
    nodes = {nid: r.output for nid, r in rows.items()
             if r.status in (NodeStatus.DONE, NodeStatus.FAILED) and "[" not in nid}  # not a map's item nodes
    return {"input": flow_input(run), "nodes": nodes}


def _body_node(mapnode: Node, child: str) -> BodyNode:
    assert mapnode.body is not None
    return next(n for n in mapnode.body.nodes if n.id == child)


def _item_outputs(rows: dict[str, FlowNodeRun], map_id: str, index: int) -> dict[str, Any]:
    prefix = f"{map_id}[{index}]."
    return {nid[len(prefix):]: r.output for nid, r in rows.items()
            if nid.startswith(prefix) and r.status in (NodeStatus.DONE, NodeStatus.FAILED)}


def _item_scope(run: Run, rows: dict[str, FlowNodeRun], mapnode: Node, index: int) -> dict[str, Any]:
    items = rows[mapnode.id].inputs.get("items") or []
    return item_scope(_scope(run, rows), items[index], index, _item_outputs(rows, mapnode.id, index))


def _open_maps(run: Run, flow: FlowDefinition, ready: list[str], scope: dict[str, Any], now: Any) -> bool:
    """Ready map nodes: their list is evaluated once and kept on the row (a resumed map sees the same items); a list
    that is not one, or is too long, fails the node."""
    events: list[Event] = []
    for nid in ready:
        node, span = flow.node(nid), new_span_id()
        error = ""
        try:
            items = evaluate(node.over or "", scope)
        except Exception as exc:
            items, error = None, f"the map's list could not be evaluated: {exc}"
        if not error and not isinstance(items, list):
            error = f"the map's list {node.over!r} is not a list (it is {type(items).__name__}); a map runs over a list"
        elif not error and len(items) > MAP_MAX_ITEMS:
            error = f"the map's list has {len(items)} items; a map takes at most {MAP_MAX_ITEMS}"
        status = NodeStatus.FAILED if error else NodeStatus.RUNNING
        FlowNodeRun.objects.update_or_create(run=run, node_id=nid, defaults={
            "tenant_id": run.tenant_id, "kind": "map", "status": status, "attempt": 1,
            "inputs": {"items": items if not error else None}, "span_id": span, "started_at": now, "error": error,
            "output": {"error": error} if error and node.on_error == "continue" else None,
            "lease_token": "", "lease_expires_at": None, "finished_at": now if error else None})
        events.append(Event("flow.node.started", {"node": nid, "kind": "map", "attempt": 1,
                                                  "items": len(items) if isinstance(items, list) else None}, span_id=span))
        if error:
            events.append(Event("flow.node.finished", {"node": nid, "kind": "map", "status": "failed", "error": error},
                                parent_span_id=span))
    if events:
        publish_after_commit(run, _append(run, events), run_summary(run))
    return bool(ready)


def _map_steps(run: Run, flow: FlowDefinition, rows: dict[str, FlowNodeRun], states: dict[str, str], *,
               room: int) -> dict[str, Any]:
    """Each running map's next step (``runtime.flows.plan_map``) from its item rows."""
    out: dict[str, Any] = {}
    maps = [n for n in flow.nodes if n.kind == "map" and states.get(n.id) == NodeStatus.RUNNING]
    for node in maps:
        item_states: dict[int, dict[str, str]] = {}
        chosen: dict[int, dict[str, list[str]]] = {}
        for nid, status in states.items():
            parts = split_item_node_id(nid)
            if parts is None or parts[0] != node.id:
                continue
            item_states.setdefault(parts[1], {})[parts[2]] = status
            if rows[nid].kind == "switch" and status == NodeStatus.DONE:
                chosen.setdefault(parts[1], {})[parts[2]] = rows[nid].chosen
        count = len(rows[node.id].inputs.get("items") or [])
        out[node.id] = plan_map(node, count, item_states, chosen, room=room)
    return out


def _settle_maps(run: Run, flow: FlowDefinition, rows: dict[str, FlowNodeRun], steps: dict[str, Any],
                 scope: dict[str, Any], now: Any) -> bool:
    """Write item nodes' skips, and finish the maps that are over: their output is the items' results in order."""
    for map_id, step in steps.items():
        if step.skip:
            _skip(run, tuple(item_node_id(map_id, i, c) for i, c in step.skip), now)
            return True
    events: list[Event] = []
    for map_id, step in steps.items():
        if step.outcome is None:
            continue
        node, row = flow.node(map_id), rows[map_id]
        items = row.inputs.get("items") or []
        errors = {i: _item_error(rows, map_id, i) for i in step.failed}
        error = ""
        output_value: Any = None
        if step.outcome == "failed":
            first = min(errors)
            error = f"item {first} failed: {errors[first]}"
            output_value = {"error": error} if node.on_error == "continue" else None
        else:
            output_value = []
            for index in range(len(items)):
                if index in errors:
                    output_value.append({"error": errors[index]})
                    continue
                outs = _item_outputs(rows, map_id, index)
                try:
                    output_value.append(item_output(node, item_scope(scope, items[index], index, outs), outs))
                except Exception as exc:
                    output_value.append({"error": f"the item's output could not be evaluated: {exc}"})
        status = NodeStatus.FAILED if error else NodeStatus.DONE
        FlowNodeRun.objects.filter(pk=row.pk).update(status=status, output=output_value, error=error, finished_at=now)
        payload: dict[str, Any] = {"node": map_id, "kind": "map", "status": str(status), "output": _summary(output_value),
                                   "failed_items": list(step.failed)}
        if error:
            payload["error"] = error
        events.append(Event("flow.node.finished", payload, parent_span_id=row.span_id))
    if events:
        publish_after_commit(run, _append(run, events), run_summary(run))
    return bool(events)


def _item_error(rows: dict[str, FlowNodeRun], map_id: str, index: int) -> str:
    prefix = f"{map_id}[{index}]."
    failed = sorted((r.finished_at or timezone.now(), nid) for nid, r in rows.items()
                    if nid.startswith(prefix) and r.status == NodeStatus.FAILED)
    if not failed:
        return "failed"
    nid = failed[0][1]
    return f"node {nid[len(prefix):]}: {rows[nid].error}"


def _definition(run: Run) -> FlowDefinition:
    return version_definition(run.version)


def version_definition(version: Any) -> FlowDefinition:
    """A flow version's graph, validated once per loaded version (a task's, an inline driver's for all its waves, a
    replay's) and once per process for the same document (the many node tasks of one version's runs)."""
    flow = getattr(version, "_flow_definition", None)
    if flow is None:
        flow = _parsed(json.dumps(version.definition, sort_keys=True, default=str))
        version._flow_definition = flow  # type: ignore[attr-defined]
    return flow


@lru_cache(maxsize=64)
def _parsed(document: str) -> FlowDefinition:
    """Keyed by the document itself, not the version's id: whatever happens to a version, a changed graph is parsed
    again. The result is shared: treat it as read-only (the runner does)."""
    return FlowDefinition.model_validate(json.loads(document))


def _rows(run_id: Any) -> dict[str, FlowNodeRun]:
    return {r.node_id: r for r in _node_rows(_uuid(run_id))}


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _node_rows(run_id: uuid.UUID) -> list[FlowNodeRun]:
    return list(FlowNodeRun.objects.filter(run_id=run_id).order_by("id"))  # by id: no join for the default order


def _node_with_run(run_id: uuid.UUID, node_id: str) -> FlowNodeRun | None:
    return FlowNodeRun.objects.select_related("run__tenant", "run__agent", "run__version", "run__session").filter(
        run_id=run_id, node_id=node_id).first()


def _flow_run(run_id: uuid.UUID) -> Run:
    return Run.objects.select_related("tenant", "agent", "version", "session").get(pk=run_id)


def _locked_flow_run(run_id: uuid.UUID) -> Run:
    """The run, its row and its tenant's locked as _lock_sql takes them (not the agent's, ...)."""
    return Run.objects.select_for_update(of=("self", "tenant"), no_key=True).select_related(
        "tenant", "agent", "version", "session").get(pk=run_id)


def _named_tools(tenant_id: int, names: list[str]) -> list[Any]:
    return list(callable_tools(tenant_id).filter(name__in=names))


def _append(run: Run, events: list[Event]) -> list[RunEvent]:
    """Write events at the run's next seqs (locks the run's row until the caller's transaction ends; a run that
    :func:`advance` locked and read is not read again)."""
    if not getattr(run, "_locked_row", False):
        locked = Run.objects.select_for_update().only("last_seq", "step").get(pk=run.pk)
        run.last_seq, run.step = locked.last_seq, locked.step
    writes = Writes(run, {})
    rows = writes.append(events)
    writes.flush()
    return rows


class Writes:
    """The writes of one :func:`advance` transaction, sent together when it ends (``core/batch.py``: one statement
    on PostgreSQL): nodes' completions and starts, their audit rows, the run's events and its own row. The run's
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
        self.wave: Wave | None = None
        #: nodes this transaction's completions took out of the running (their leases were alive): places a
        #: decision in the same transaction may hand on without counting the tenant's nodes (:func:`_hand_over`)
        self.freed = 0
        #: ``(sql, params)``: no lock was taken; the writes go out as ONE statement that writes only if this guard
        #: finds the run as the last commit left it (:func:`_complete_guarded`)
        self.guard: tuple[str, list[Any]] | None = None

    def append(self, events: list[Event]) -> list[RunEvent]:
        """The events at the run's next seqs, one step (what :func:`_append` sends at once)."""
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

    def flush(self, *, final: bool = False) -> None:
        """``final``: the transaction's last writes (a guarded transaction may send only those, see ``guard``)."""
        if self.guard is not None and not final:
            raise _Unguarded("a decision that writes more than its one statement")
        if self._run_changes:
            self.batch.update_where(Run, {"id": self.run.pk}, **self._run_changes)
            self._run_changes = {}
        if self.guard is not None:
            guard, self.guard = self.guard, None
            if not self.batch.can_guard():
                raise _Unguarded("writes the guarded statement cannot hold")
            if self.batch.execute_guarded(*guard) is None:
                raise _Unguarded("another writer came between", contended=True)  # nothing was written
        else:
            self.batch.execute()
        self.left_seq = self.run.last_seq


class _Unguarded(Exception):
    """A guarded commit (:func:`_complete_guarded`) that wrote nothing: its transaction is rolled back, and the
    completions commit the locked way. ``contended``: its guard found the run changed by another writer (not a
    decision that needed more than one statement)."""

    def __init__(self, why: str, *, contended: bool = False) -> None:
        super().__init__(why)
        self.contended = contended


_LOCKED = ("status", "cancel_requested", "last_seq", "step", "usage", "phase", "lease_token")


def _lock_sql(with_head: bool) -> str:
    """The run's row and its tenant's (the tenant's node bound is decided under it, as advance() always did) and, for a
    commit with audit rows, the tenant's audit chain head, locked and read in one statement. The tenant's running nodes
    are NOT counted here: this statement reads other tables with the snapshot it took before it waited for the locks,
    so a count here would miss the nodes that a transaction holding the tenant's lock started meanwhile, and the
    tenant's bound would be exceeded (``advance`` counts after the lock, when it has something to start). Names come
    from the models' metadata; the value is a parameter."""
    run, tenant, head = Run._meta, Tenant._meta, AuditChainHead._meta
    tenant_col = run.get_field("tenant").column
    columns = ", ".join(f'r."{run.get_field(name).column}"' for name in _LOCKED)
    sql = f'SELECT {columns}'
    if with_head:
        sql += f', h."{head.get_field("seq").column}", h."{head.get_field("hash").column}"'
    sql += (f' FROM "{run.db_table}" r JOIN "{tenant.db_table}" t ON t."{tenant.pk.column}" = r."{tenant_col}"')
    if with_head:
        sql += f' JOIN "{head.db_table}" h ON h."{head.pk.column}" = r."{tenant_col}"'
    # The lock order of audit/chain.py: run, tenant, chain head (locked in that order, the order of the join).
    # NO KEY UPDATE: exclusive against another flow's lock of the same rows, yet no wait for (nor of) the KEY SHARE
    # lock a foreign-key check of a row that references them takes; an agent step holding the chain head checks its
    # audit rows' keys to the tenant at commit: FOR UPDATE here made the two wait for each other (deadlock detected).
    return sql + f' WHERE r."{run.pk.column}" = %s FOR NO KEY UPDATE OF r, t' + (", h" if with_head else "")


_LOCK_SQL = {True: _lock_sql(True), False: _lock_sql(False)}


def _lock(run: Run, *, with_head: bool) -> tuple[bool, AuditChainHead | None]:
    """Lock the run (and its tenant, and the audit chain head when asked) and refresh the run's changing fields in
    place: ``(found, head)``. One statement on PostgreSQL once the head exists; elsewhere the run here and the head
    by the audit's own lock."""
    if connection.vendor == "postgresql":
        for head_too in ((True, False) if with_head else (False,)):  # a tenant's first audit row: no head yet
            with connection.cursor() as cursor:
                cursor.execute(_LOCK_SQL[head_too], [run.pk])
                found = cursor.fetchone()
            if found is None:
                continue
            values = dict(zip(_LOCKED, found[: len(_LOCKED)], strict=True))
            if isinstance(values["usage"], str):
                values["usage"] = json.loads(values["usage"])
            for name, value in values.items():
                setattr(run, name, value)
            run._locked_row = True  # type: ignore[attr-defined]
            head = AuditChainHead(tenant_id=run.tenant_id, seq=found[-2], hash=found[-1]) if head_too else None
            return True, head
        return False, None
    values = Run.objects.select_for_update().filter(pk=run.pk).values(*_LOCKED).first()
    if values is None:
        return False, None
    for name, value in values.items():
        setattr(run, name, value)
    run._locked_row = True  # type: ignore[attr-defined]
    return True, None


def _running_elsewhere_sql() -> str:
    """The tenant's live nodes in its other runs plus its agent runs a worker executes (``agents.capacity.running_runs``:
    a live lease, not a flow run), in one statement."""
    node, run, agent = FlowNodeRun._meta, Run._meta, Agent._meta
    column = {name: node.get_field(name).column for name in ("tenant", "status", "lease_expires_at", "run")}
    on_run = {name: run.get_field(name).column for name in ("tenant", "status", "lease_token", "lease_expires_at", "agent")}
    return (f'SELECT (SELECT count(*) FROM "{node.db_table}" WHERE "{column["tenant"]}" = %s '  # noqa: S608
            f'AND "{column["status"]}" = %s AND "{column["lease_expires_at"]}" >= %s AND "{column["run"]}" <> %s) + '
            f'(SELECT count(*) FROM "{run.db_table}" r JOIN "{agent.db_table}" a ON a."{agent.pk.column}" = '
            f'r."{on_run["agent"]}" WHERE r."{on_run["tenant"]}" = %s AND r."{on_run["status"]}" = %s '
            f'AND r."{on_run["lease_token"]}" <> \'\' AND r."{on_run["lease_expires_at"]}" >= %s '
            f'AND a."{agent.get_field("kind").column}" <> %s)')


_RUNNING_ELSEWHERE_SQL = _running_elsewhere_sql()


def _tenant_running_elsewhere(run: Run, now: Any) -> int:
    """The tenant's running work but this run's nodes: its nodes running (lease alive) in its other runs and its agent
    runs (they share the bound, agents/capacity.py). A statement of its own, made after the tenant's row is locked
    (see :func:`_lock_sql`). Its text is fixed (a prepared statement on PostgreSQL): building and compiling the ORM's
    count took more CPU than PostgreSQL's answer (1.4 against 0.3 ms)."""
    at = FlowNodeRun._meta.get_field("lease_expires_at").get_db_prep_value(now, connection)
    run_id = Run._meta.pk.get_db_prep_value(run.pk, connection)
    with connection.cursor() as cursor:
        cursor.execute(_RUNNING_ELSEWHERE_SQL, [run.tenant_id, NodeStatus.RUNNING.value, at, run_id,
                                                run.tenant_id, RunStatus.RUNNING.value, at, AgentKind.FLOW.value])
        found = cursor.fetchone()
    return int(found[0]) if found else 0


def _hand_over(flow: FlowDefinition, ready: list[str], wanted: list[Any], freed: int) -> bool:
    """Whether the nodes about to start only take the places the same transaction's completions freed (a chain's
    next node, a join after its branches), so the tenant's bound cannot be passed by starting them and its running
    nodes need not be counted. Not with an approval among them: a decision with one starts as before."""
    return 0 < len(ready) + len(wanted) <= freed and not any(flow.node(n).kind == "approval" for n in ready)


def call_id(run_id: Any, node_id: str) -> str:
    """The node's call id on every attempt (at most 99 characters: tool audit and approval rows hold 100)."""
    return f"fl:{uuid.UUID(str(run_id)).hex}:{node_id}"


def _tenant_bound(run: Run) -> int:
    """The tenant's bound on running work, its agent runs and flow nodes together (agents/capacity.py)."""
    return capacity.bound(run.tenant)


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


def advance(run_id: Any, *, savepoint: bool = True, pending: list[Event] | None = None,
            writes: Writes | None = None) -> list[tuple[str, str]]:
    """Decide the flow's next step from its committed rows; returns the ``(node, token)`` pairs it started.

    The node tasks are enqueued when this transaction commits (inline nodes are run by :func:`_drive` then); tests may
    call :func:`execute_node` themselves. ``savepoint=False``: inside a transaction that fails as a whole.
    ``pending``: events of completions committed in the same transaction (an inline wave's), written first.
    ``writes``: the completions' own writes, their run locked and rows read under that lock (:func:`_complete`);
    the decision's writes join them, and all go out together at the end.
    """
    started: list[tuple[str, str]] = []
    with transaction.atomic(savepoint=savepoint):
        if writes is None:
            run = _locked_flow_run(_uuid(run_id))
            run._locked_row = True  # type: ignore[attr-defined]  # _append need not lock and read it again
            writes = Writes(run, _rows(run.pk))
        run, rows = writes.run, writes.rows
        if pending:
            publish_after_commit(run, writes.append(pending), run_summary(run))
        if run.status != RunStatus.RUNNING:
            writes.flush()
            return []
        if run.cancel_requested:
            writes.flush()
            finish_without_worker(run, TerminalReason.CANCELLED, "cancelled")
            return []
        flow = _definition(run)
        now = timezone.now()
        redo: set[str] = set()
        if any(r.status == NodeStatus.WAITING for r in rows.values()):
            writes.flush()
            rows = _rows(run.pk)  # as committed, with their ids
            redo = _decided(run, flow, rows, now)  # waiting nodes whose approval was decided meanwhile
            rows = _rows(run.pk)  # _decided may have finished some: read them again
        while True:
            states = {nid: r.status for nid, r in rows.items()}
            for nid in redo:
                if states.get(nid) == NodeStatus.WAITING:
                    states[nid] = NodeStatus.PENDING  # an approved (or rejected) tool call: the gateway hears the decision
            stale = {nid for nid, r in rows.items()
                     if r.status == NodeStatus.RUNNING and r.lease_expires_at is not None and r.lease_expires_at < now}
            for nid in stale:
                states[nid] = NodeStatus.PENDING  # its worker died: start it again
            chosen = {nid: r.chosen for nid, r in rows.items() if r.kind == "switch" and r.status == NodeStatus.DONE}
            top = {n.id for n in flow.nodes}
            routed = [h for nid, r in rows.items() if r.status == NodeStatus.FAILED and nid in top
                      for h in [flow.node(nid).handler] if h and flow.node(nid).on_error == "route"]
            items_busy = sum(1 for nid, s in states.items() if s == NodeStatus.RUNNING and nid not in top)
            step = plan(flow, states, chosen, routed=routed, busy=items_busy)
            if step.skip:
                writes.flush()
                _skip(run, step.skip, now)
                rows = _rows(run.pk)
                continue
            maps = [n for n in step.ready if flow.node(n).kind == "map"]
            if maps:
                writes.flush()
            if maps and _open_maps(run, flow, maps, _scope(run, rows), now):
                rows = _rows(run.pk)
                continue
            map_steps = _map_steps(run, flow, rows, states, room=flow.max_parallel)
            if map_steps:
                writes.flush()
            if map_steps and _settle_maps(run, flow, rows, map_steps, _scope(run, rows), now):
                rows = _rows(run.pk)
                continue
            break
        writes.rows = rows
        if step.outcome is not None:
            if step.failed_node:  # a map cut short by another node's failure: it started no more items
                writes.flush()
                FlowNodeRun.objects.filter(run=run, kind="map", status=NodeStatus.RUNNING).update(
                    status=NodeStatus.FAILED, error=f"stopped: node {step.failed_node} failed", finished_at=now)
            _finish(run, flow, step.outcome, step.failed_node, rows, writes)
            writes.flush(final=True)
            return []
        ready = [n for n in step.ready if flow.node(n).kind != "map"]
        events: list[Event] = []
        scope = _scope(run, rows)
        item_steps = _map_steps(run, flow, rows, states, room=flow.max_parallel)
        wanted = [(m, i, c) for m, ms in item_steps.items() for i, c in ms.ready] if not step.failed_node else []
        busy = 0  # the tenant's running nodes: counted only when there is something to start (a fan-in waits often)
        if ready or wanted:  # the tenant's other runs' and this run's live nodes, counted now that the tenant is locked
            own = sum(1 for nid, r in rows.items() if r.status == NodeStatus.RUNNING and nid not in stale
                      and r.lease_expires_at is not None and r.lease_expires_at >= now)
            if _hand_over(flow, ready, wanted, writes.freed):
                # no count: every start (this one included) is decided under the tenant's lock and leaves its live
                # nodes within the bound, and live nodes only ever stop; the completions of this transaction freed
                # ``freed`` places, so the others hold at most the bound less this run's live nodes and those
                others = max(_tenant_bound(run) - own - writes.freed, 0)
            else:
                if writes.guard is not None:  # counting needs the tenant's lock
                    raise _Unguarded("the tenant's running nodes must be counted")
                others = _tenant_running_elsewhere(run, now)
            busy = others + own
        room = max(_tenant_bound(run) - busy, 0)
        held = [n for n in ready if flow.node(n).kind != "approval"][room:]
        ready = [n for n in ready if n not in held]
        # item nodes of running maps: in what the run's max_parallel and the tenant's bound leave
        running_now = items_busy + sum(1 for n in flow.nodes if states.get(n.id) == NodeStatus.RUNNING and n.kind != "map")
        item_room = min(flow.max_parallel - running_now - len(ready), room - len(ready))
        held += [item_node_id(m, i, c) for m, i, c in wanted[max(item_room, 0):]]
        items = [(item_node_id(m, i, c), flow.node(m), i, c) for m, i, c in wanted[:max(item_room, 0)]]
        asks = [n for n in ready if flow.node(n).kind == "approval"]
        if asks:
            writes.flush()
        for nid in asks:  # a person, not a task: wait for them
            ready.remove(nid)
            events.append(_ask(run, flow.node(nid), rows, scope, now))
            states[nid] = NodeStatus.WAITING
        fresh: list[FlowNodeRun] = []  # first starts: one INSERT for all of them (a fan-out starts ten at once)
        for nid in ready:
            node, row = flow.node(nid), rows.get(nid)
            token = uuid.uuid4().hex
            span = row.span_id if row is not None and row.span_id else new_span_id()
            attempt = (row.attempt if row is not None else 0) + 1
            try:
                inputs = node_arguments(node, scope)
            except Exception as exc:  # a mapping that cannot be evaluated (a JMESPath type error): the node fails
                inputs = {"_mapping_error": str(exc)}
            fields = {"tenant_id": run.tenant_id, "kind": node.kind, "status": NodeStatus.RUNNING, "attempt": attempt,
                      "inputs": inputs, "span_id": span, "started_at": now, "lease_token": token,
                      "lease_expires_at": now + dt.timedelta(seconds=node.timeout_seconds + _grace())}
            if row is None:
                rows[nid] = FlowNodeRun(run=run, node_id=nid, **fields)
                fresh.append(rows[nid])
            else:  # a restart (its worker died) or a waiting tool node run again with its approval's decision
                writes.batch.update_where(FlowNodeRun, {"run_id": run.pk, "node_id": nid}, **fields)
                for name, value in fields.items():
                    setattr(row, name, value)
            payload = {"node": nid, "kind": node.kind, "attempt": attempt, "inputs": _summary(inputs)}
            events.append(Event("flow.node.started", payload, span_id=span))
            started.append((nid, token))
        writes.batch.insert(FlowNodeRun, fresh)  # the run's row lock orders this against any other advance()
        fresh_items: list[FlowNodeRun] = []
        for nid, mapnode, index, child in items:
            body = _body_node(mapnode, child)
            row = rows.get(nid)
            token, span, attempt = uuid.uuid4().hex, (row.span_id if row and row.span_id else new_span_id()), \
                (row.attempt if row is not None else 0) + 1
            try:
                inputs = node_arguments(body, _item_scope(run, rows, mapnode, index))
            except Exception as exc:
                inputs = {"_mapping_error": str(exc)}
            fields = {"tenant_id": run.tenant_id, "kind": body.kind, "status": NodeStatus.RUNNING, "attempt": attempt,
                      "inputs": inputs, "span_id": span, "started_at": now, "lease_token": token,
                      "lease_expires_at": now + dt.timedelta(seconds=body.timeout_seconds + _grace())}
            if row is None:
                rows[nid] = FlowNodeRun(run=run, node_id=nid, **fields)
                fresh_items.append(rows[nid])
            else:
                writes.batch.update_where(FlowNodeRun, {"run_id": run.pk, "node_id": nid}, **fields)
                for name, value in fields.items():
                    setattr(row, name, value)
            events.append(Event("flow.node.started", {"node": nid, "kind": body.kind, "attempt": attempt, "map": mapnode.id,
                                                      "index": index, "inputs": _summary(inputs)},
                                span_id=span, parent_span_id=rows[mapnode.id].span_id))
            started.append((nid, token))
        writes.batch.insert(FlowNodeRun, fresh_items)
        if held and not started and not any(s == NodeStatus.RUNNING for s in states.values()):
            events.append(Event("flow.throttled", {"waiting": held, "tenant_running_nodes": busy,
                                                   "limit": _tenant_bound(run)}))
        if events:
            publish_after_commit(run, writes.append(events), run_summary(run))
        in_flight = bool(started) or any(s == NodeStatus.RUNNING for s in states.values())
        if not in_flight and not held and any(s == NodeStatus.WAITING for s in states.values()):
            writes.flush()
            _wait(run)
        else:  # nodes in flight (or held): the run's lease expiry follows them, the node tasks renew it
            writes.update_run(lease_expires_at=now + dt.timedelta(seconds=settings.RUN_LEASE_SECONDS))
        writes.flush(final=True)
        if started:
            inline = [(n, t) for n, t in started if flow.runs_inline(n)]
            tasks = [(n, t) for n, t in started if not flow.runs_inline(n)]
            if tasks:
                transaction.on_commit(lambda: _enqueue(str(run.pk), tasks))
            if inline:
                transaction.on_commit(lambda: _drive(str(run.pk), inline, writes))
    return started


def _ask(run: Run, node: Node, rows: dict[str, FlowNodeRun], scope: dict[str, Any], now: Any) -> Event:
    """An approval node: one approval request (the approvers' page, rules and audit of tool approvals), the node waits
    (its row, in ``rows`` too)."""
    row = rows.get(node.id)
    from approvals.decisions import publish
    from approvals.models import ApprovalRequest, NotifyEvent
    from approvals.tasks import enqueue_notice

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
    waiting, _ = FlowNodeRun.objects.update_or_create(run=run, node_id=node.id, defaults={
        "tenant_id": run.tenant_id, "kind": node.kind, "status": NodeStatus.WAITING, "attempt": 1, "inputs": inputs,
        "span_id": span, "started_at": now, "lease_token": "", "lease_expires_at": None})
    rows[node.id] = waiting
    return Event("flow.node.waiting", {"node": node.id, "kind": "approval", "approval_id": str(request.pk),
                                       "preview": _summary(text)}, span_id=span)


def _decided(run: Run, flow: FlowDefinition, rows: dict[str, FlowNodeRun], now: Any) -> set[str]:
    """Settle waiting nodes whose approval was decided: an approval node finishes (approved) or fails (rejected,
    expired, cancelled: its on_error decides); a tool node's ids are returned to be run again with the decision."""
    from approvals.models import ApprovalRequest, ApprovalStatus

    # an agent node whose child run paused for a person waits with no task held; once the child ended, it runs again
    # (and finds the child's answer)
    children = {r.child_run_id: nid for nid, r in rows.items()
                if r.status == NodeStatus.WAITING and r.kind == "agent" and r.child_run_id is not None}
    ended = set(Run.objects.filter(pk__in=list(children), status=RunStatus.FINISHED).values_list("pk", flat=True)) \
        if children else set()
    redo: set[str] = {children[pk] for pk in ended}
    waiting = {call_id(run.pk, nid): nid for nid, r in rows.items()
               if r.status == NodeStatus.WAITING and r.kind != "agent"}
    if not waiting:
        return redo
    decided = ApprovalRequest.objects.filter(run_id=run.pk, call_id__in=list(waiting)).exclude(status=ApprovalStatus.PENDING)
    events: list[Event] = []
    for request in decided.prefetch_related("decisions"):
        nid = waiting[request.call_id]
        node = flow.node(nid)
        if node.kind != "approval":
            redo.add(nid)
            continue
        notes = [d.note for d in request.decisions.all() if d.note]
        approved = request.status == ApprovalStatus.APPROVED
        output = {"approved": approved, "status": request.status, "notes": notes}
        error = "" if approved else f"{request.status} by an approver" + (f": {notes[-1]}" if notes else "")
        if not approved and node.on_error == "continue":
            output["error"] = error
        FlowNodeRun.objects.filter(pk=rows[nid].pk, status=NodeStatus.WAITING).update(
            status=NodeStatus.DONE if approved else NodeStatus.FAILED, output=output, error=error, finished_at=now)
        payload = {"node": nid, "kind": "approval", "status": "done" if approved else "failed", "output": _summary(output)}
        if error:
            payload["error"] = error
        events.append(Event("flow.node.finished", payload, parent_span_id=rows[nid].span_id))
    if events:
        publish_after_commit(run, _append(run, events), run_summary(run))
    return redo


def _enqueue(run_id: str, started: list[tuple[str, str]]) -> None:
    from flows.tasks import execute_node_task

    for node_id, token in started:
        try:
            execute_node_task.delay(run_id, node_id, token)
        except Exception:  # the broker is down: the node's lease expires and the sweeper's advance restarts it
            log.warning("flow run %s: node %s not enqueued; it restarts when its lease expires", run_id, node_id,
                        exc_info=True)


def _skip(run: Run, node_ids: tuple[str, ...], now: Any) -> None:
    for nid in node_ids:
        FlowNodeRun.objects.update_or_create(run=run, node_id=nid, defaults={
            "tenant_id": run.tenant_id, "status": NodeStatus.SKIPPED, "finished_at": now})
    rows = _append(run, [Event("flow.node.skipped", {"node": nid}) for nid in node_ids])
    publish_after_commit(run, rows, run_summary(run))


def _renew(run_id: Any, node_id: str, token: str, seconds: float) -> bool:
    now = timezone.now()
    if not FlowNodeRun.objects.filter(run_id=run_id, node_id=node_id, lease_token=token,
                                      status=NodeStatus.RUNNING).update(lease_expires_at=now + dt.timedelta(seconds=seconds)):
        return False
    Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(
        lease_expires_at=now + dt.timedelta(seconds=settings.RUN_LEASE_SECONDS))
    return True


def execute_node(run_id: Any, node_id: str, token: str) -> None:
    """Run one started node and commit its completion; a duplicate or stale task (its token gone) does nothing."""
    # one read: this node's row with its run (a tool or agent node's inputs were evaluated when it started: its own
    # row is all it reads); a node whose conditions or prompts see earlier outputs reads the run's rows too
    row = _node_with_run(_uuid(run_id), node_id)
    if row is None:
        log.info("flow run %s: node %s has nothing to run (the run or its row is gone)", run_id, node_id)
        return
    run = row.run
    flow = _definition(run)
    parts = split_item_node_id(node_id)
    if parts is None and next((n.kind for n in flow.nodes if n.id == node_id), None) in ("tool", "agent"):
        rows = {node_id: row}
    else:
        rows = _rows(run_id)
        row = rows.get(node_id)
    if row is None or not row.lease_token or row.lease_token != token or row.status != NodeStatus.RUNNING:
        log.info("flow run %s: node %s is not this task's to run (finished, or restarted by another)", run_id, node_id)
        return
    node: BodyNode
    if parts is None:
        node, scope = flow.node(node_id), _scope(run, rows)
    else:  # a map's item node (a running map itself holds no token: its items' nodes run, not the map)
        mapnode = flow.node(parts[0])
        node, scope = _body_node(mapnode, parts[2]), _item_scope(run, rows, mapnode, parts[1])
    audit = StepAudit()
    trace: list[Event] = []  # the node's model and tool call events, committed with its completion
    lease = node.timeout_seconds + _grace()
    with LeaseHeartbeat(lambda: _renew(run_id, node_id, token, lease), interval=max(0.5, min(_grace() / 3, 10.0))):
        status, output, chosen, error = _attempts(run, flow, node, row, scope, audit, trace, item=parts is not None)
    _complete(run, [Done(row.node_id, token, node.kind, audit, trace, status, output, chosen, error)])


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


def _complete(run: Run, done: list[Done], last: Writes | None = None, wave: Wave | None = None) -> None:
    """Commit finished nodes and advance the flow, in ONE transaction: under the run's lock (one statement with the
    tenant's audit chain head, see :func:`_lock`) the node rows are read once; a node whose lease was taken meanwhile
    (restarted elsewhere) is dropped; the others' rows, sealed audit rows and events, and then the next decision's
    writes (:func:`advance`), go out as one statement. If any of it fails nothing is committed: the nodes keep
    their leases and run again when those expire.

    ``last``: the transaction that started these nodes (an inline wave's). Its rows are still the committed ones
    when nothing else wrote since: the run's event sequence is where it left it (every change of a node row but a
    task's lease renewal appends an event) and no node of the run runs in a task of its own (none renews a lease);
    then they are not read again, and the commit is first tried without the lock (:func:`_complete_guarded`)."""
    if last is not None and wave is not None and _may_guard(run, done, last, wave):
        head = wave.head
        try:  # a real transaction around the one guarded statement: a nested atomic(), a savepoint or on_commit hold
            with transaction.atomic():
                _complete_guarded(run, done, last, wave)
            return
        except _Unguarded as why:  # rolled back, nothing written: the locked way, which reads what changed
            log.debug("flow run %s: the wave commits the locked way (%s)", run.pk, why)
            last = None  # the rows in memory went ahead of the database: read them again
            if why.contended:  # another writer: this run's later waves lock first
                wave.contended, wave.head = True, None
            else:  # nothing was sent: the head is as it was
                wave.head = head
        except Exception as exc:  # it lost a deadlock (nothing written): the locked way, as for another writer
            if not is_conflict(exc):
                raise
            last, wave.contended, wave.head = None, True, None
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
            found, head = _lock(run, with_head=any(len(d.audit) for d in done))
            if not found:
                return
            reuse = last is not None and run.last_seq == last.left_seq and not _tasks_running(run, last.rows)
            writes = Writes(run, last.rows if reuse and last is not None else _rows(run.pk))
            _record(run, done, writes, head, now, wave)

    retried(commit, what=f"flow run {run.pk}'s completion of {', '.join(d.node_id for d in done)}")


def _tasks_running(run: Run, rows: dict[str, FlowNodeRun]) -> bool:
    """Whether a node of the run runs in a task of its own (which renews its lease without an event)."""
    return any(r.status == NodeStatus.RUNNING and not _definition(run).runs_inline(nid) for nid, r in rows.items())


def _may_guard(run: Run, done: list[Done], last: Writes, wave: Wave) -> bool:
    """Whether an inline wave's completions may commit without locking first: on PostgreSQL, nothing else wrote to
    the run since the transaction that started the wave (as far as this thread knows; the guard checks it), and the
    tenant's audit chain head is known when there are audit rows to seal."""
    return (connection.vendor == "postgresql" and not wave.contended and run.last_seq == last.left_seq
            and (wave.head is not None or not any(len(d.audit) for d in done)) and not _tasks_running(run, last.rows))


#: The wave's guard (``agents.store.guard_sql``): the run still running, uncancelled, its events and step where the
#: commit before the wave left them.
_WAVE_GUARD = ("last_seq", "step", "status")
_GUARD_SQL = {head: guard_sql(_WAVE_GUARD, with_head=head, uncancelled=True) for head in (True, False)}


def _complete_guarded(run: Run, done: list[Done], last: Writes, wave: Wave) -> None:
    """An inline wave's completions and the next decision with no lock taken first: decided from the run and rows the
    wave's own transaction left, they go out as ONE statement that writes only if the run's row (and the tenant's
    chain head, for audit rows) is still as that transaction left it, under their locks (the agent step's guarded
    commit, ``agents/store.py``). Only a decision that needs nothing more qualifies: one that would count the
    tenant's nodes (a start beyond a hand-over), settle approvals, skips or maps, or wait, raises
    :class:`_Unguarded` before anything is written, as does a guard that finds the run changed."""
    head = None
    if any(len(d.audit) for d in done):
        assert wave.head is not None
        head = AuditChainHead(tenant_id=run.tenant_id, seq=wave.head[0], hash=wave.head[1])
    writes = Writes(run, last.rows)
    params: list[Any] = [run.pk, run.last_seq, run.step, RunStatus.RUNNING.value]
    writes.guard = (_GUARD_SQL[head is not None], params + ([head.seq, head.hash] if head is not None else []))
    _record(run, done, writes, head, timezone.now(), wave)
    if writes.guard is not None and writes.batch:  # a decision that returned before its last writes (cannot happen)
        raise _Unguarded("writes left unsent")


def _record(run: Run, done: list[Done], writes: Writes, head: AuditChainHead | None, now: Any, wave: Wave | None) -> None:
    """The completions' writes (node rows, sealed audit rows, events, usage) into ``writes``, then the next decision
    (:func:`advance`) in the same transaction, which sends them all."""
    rows = writes.rows
    writes.wave = wave  # the next wave of this run, in this thread, starts from it
    audit, events, calls = StepAudit(), [], []
    for d in done:
        row = rows.get(d.node_id)
        if row is None or row.lease_token != d.token or row.status != NodeStatus.RUNNING:
            log.warning("flow run %s: node %s lost its lease before committing; its result is dropped",
                        run.pk, d.node_id)
            continue
        if row.lease_expires_at is not None and row.lease_expires_at >= now:
            writes.freed += 1  # a live node stops running here
        fields = {"status": d.status, "output": d.output, "chosen": d.chosen, "error": d.error, "lease_token": "",
                  "lease_expires_at": None, "finished_at": None if d.status == NodeStatus.WAITING else now}
        writes.batch.update_where(FlowNodeRun, {"run_id": run.pk, "node_id": d.node_id, "lease_token": d.token,
                                                "status": NodeStatus.RUNNING}, **fields)
        for name, value in fields.items():
            setattr(row, name, value)
        for write in d.audit:
            audit.add(write)
        payload: dict[str, Any] = {"node": d.node_id, "kind": d.kind, "status": str(d.status),
                                   "output": _summary(d.output)}
        if d.inline:
            payload["inline"] = True
        if d.error:
            payload["error"] = d.error
        if d.chosen:
            payload["chosen"] = d.chosen
        kind = "flow.node.waiting" if d.status == NodeStatus.WAITING else "flow.node.finished"
        events += [*d.trace, Event(kind, payload, parent_span_id=row.span_id)]
        calls += [e for e in d.trace if e.type == "model.call"]
    if not events:
        writes.guard = None  # nothing to write
        return
    events += _attention_marks(run, writes, audit, now)
    audit.commit(run.tenant_id, writes.batch, head)
    if wave is not None and head is not None:
        wave.head = (head.seq, head.hash)  # the chain's head once this commits (sealing moved it)
    if calls:  # the nodes' model calls into the run's usage (read under the lock), as spend reads it
        usage = Usage.from_dict(run.usage)
        for call in calls:
            usage = usage + Usage(int(call.payload.get("input_tokens", 0)), int(call.payload.get("output_tokens", 0)),
                                  float(call.payload.get("cost", 0.0)))
        writes.update_run(usage=usage.to_dict())
    # the next step in the same transaction: the completions and the next nodes' start commit together or not at all
    advance(run.pk, savepoint=False, pending=events, writes=writes)


def _attention_marks(run: Run, writes: Writes, audit: StepAudit, now: Any) -> list[Event]:
    """A write whose outcome is unknown (a non-idempotent write found ``started`` by a retried node and not repeated,
    a write past its timeout) marks the run for an operator in the completion's transaction, as an agent step does
    (``agents/attention.py``): its reasons on the run's row, a ``run.needs_attention`` event each. Rare, so the locked
    way only: a guarded commit gives way (nothing written yet), and the run's reasons are read under its lock."""
    reasons = attention.reasons_for_writes(audit.pending, at=now)
    if not reasons:
        return []
    if writes.guard is not None:
        raise _Unguarded("a completion that marks the run for an operator")
    existing = Run.objects.filter(pk=run.pk).values_list("attention_reasons", flat=True).first()
    writes.update_run(needs_attention=True, attention_reasons=attention.with_reasons(existing, reasons))
    spans = {w.started_pk: w.row.span_id for w in audit.pending if w.started_pk is not None and w.row.span_id}
    return attention.events_for(reasons, spans=spans)


def _attempts(run: Run, flow: FlowDefinition, node: BodyNode, row: FlowNodeRun, scope: dict[str, Any], audit: StepAudit,
              trace: list[Event], *, item: bool = False, wave: Wave | None = None,
              started: Started | None = None) -> tuple[str, Any, list[str], str]:
    """Run a started node (its retries included): ``(status, output, chosen, error)``; nothing is committed here.
    ``started``: a tool node's first attempt, already begun (:func:`_start_tools`)."""
    status, output, error = NodeStatus.DONE, None, ""
    chosen: list[str] = []
    tries = 1 + (node.retries if node.kind in ("tool", "llm") else 0)
    began = started.began if started is not None else time.monotonic()
    for n in range(tries):
        try:
            if "_mapping_error" in row.inputs:
                raise NodeFailed(f"an input mapping could not be evaluated: {row.inputs['_mapping_error']}")
            output, chosen = _execute(run, flow, node, row.inputs, scope, audit, row.span_id, trace, row.node_id, wave,
                                      started if n == 0 else None)
            status, error = NodeStatus.DONE, ""
        except NodeWaits as exc:
            status, error = NodeStatus.WAITING, str(exc)
            if item:  # nothing resumes a map's item for a person: it fails (its on_error applies)
                status, error = NodeStatus.FAILED, f"a map's item cannot wait for an approval: {exc}"
        except NodeFailed as exc:
            status, error = NodeStatus.FAILED, str(exc)
        except Exception as exc:
            log.exception("flow run %s: node %s failed", run.pk, row.node_id)
            status, error = NodeStatus.FAILED, f"internal error: {type(exc).__name__}"
        if status == NodeStatus.DONE and time.monotonic() - began > node.timeout_seconds:
            status, error = NodeStatus.FAILED, f"timeout: the node took over {node.timeout_seconds:g}s"
        if status != NodeStatus.FAILED or n + 1 >= tries or not _retryable(node, run, wave.tools if wave else None):
            break
        log.info("flow run %s: node %s attempt %s failed (%s); retrying", run.pk, row.node_id, n + 1, error)
    if status == NodeStatus.FAILED and node.on_error == "continue":
        output = {"error": error}
    return status, output, chosen, error


_driving = threading.local()


@dataclass
class Wave:
    """What the inline waves of one flow run in one thread share: its definition, its tools and the conversation's
    grants (resolved once, not per node), and the tool policy (kill switch, install, rollout) read once per tool per
    wave instead of once per call."""

    flow: FlowDefinition
    tools: list[Any]
    grants: set[str]
    checked: dict[Any, tuple[bool, str]] = field(default_factory=dict)
    #: the tools were read for the wave about to run (the first of this thread's): it decides their policy from that
    #: read; the later waves read it again
    fresh: bool = True
    #: the tenant's audit chain head as this thread's last commit of the run left it: (seq, hash), None if not known
    head: tuple[int, str] | None = None
    #: a guarded commit found another writer had come between: this run's later waves take the locked way
    contended: bool = False

    def tool_policy(self, tool: Any, tenant_id: int, session_key: Any) -> tuple[bool, str]:
        if tool.pk not in self.checked:
            decide = tool_allowed_as_read if self.fresh else tool_allowed_for
            self.checked[tool.pk] = decide(tool, tenant_id, session_key)
        return self.checked[tool.pk]


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
    """A wave of inline nodes: run them (their tool calls side by side, :func:`_start_tools`), then commit all their
    completions (rows, events, audit) and advance the flow in ONE transaction (:func:`_complete`). The run and node
    rows are those the transaction that started the wave left (``last``): read from the database only when there is
    none. A node whose lease was taken meanwhile (restarted elsewhere) is dropped at the commit, as in
    :func:`execute_node`."""
    if last is not None:
        run, rows = last.run, last.rows
    else:
        run = _flow_run(_uuid(run_id))
        rows = _rows(run_id)
    context = last.wave if last is not None else None  # what the run's earlier waves in this thread resolved
    if context is None:
        flow = _definition(run)
        context = Wave(flow, _flow_tools(run, flow), session_grants(run))
    context.checked.clear()  # the kill switch is read again for every wave
    flow = context.flow
    scope = _scope(run, rows)
    todo = []
    for node_id, token in wave:
        row = rows.get(node_id)
        if row is None or row.lease_token != token or row.status != NodeStatus.RUNNING:
            continue
        todo.append((row, token, flow.node(node_id), StepAudit(), []))
    started = _start_tools(run, flow, todo, context)
    done = []
    for row, token, node, audit, trace in todo:
        status, output, chosen, error = _attempts(run, flow, node, row, scope, audit, trace, wave=context,
                                                  started=started.get(row.node_id))
        done.append(Done(row.node_id, token, node.kind, audit, trace, status, output, chosen, error, inline=True))
    context.fresh = False
    if done:
        _complete(run, done, last, context)


def _start_tools(run: Run, flow: FlowDefinition,
                 todo: list[tuple[FlowNodeRun, str, BodyNode, StepAudit, list[Event]]], wave: Wave) -> dict[str, Started]:
    """Begin the first attempt of a wave's tool nodes, so their tools run side by side: every gateway stage (and a
    write's ``started`` row) here, in this thread, one node after another; the calls then run on their bulkheads'
    threads while :func:`_attempts` collects them in order (a beginning that raised raises there, as if the node
    had raised it). With one tool node there is nothing to overlap: it runs as in a task."""
    tools = [(node, row, audit) for row, _, node, audit, _ in todo if node.kind == "tool" and "_mapping_error" not in row.inputs]
    if len(tools) < 2:
        return {}
    return {row.node_id: _start_tool(run, flow, node, row.inputs, audit, row.span_id, row.node_id, wave)
            for node, row, audit in tools}


def _flow_tools(run: Run, flow: FlowDefinition) -> list[Any]:
    """The tenant's tools a flow's tool nodes name (its tool list), resolved once per task."""
    return _named_tools(run.tenant_id, sorted(flow.tool_names()))


def _retryable(node: BodyNode, run: Run, tools: list[Any] | None = None) -> bool:
    """Only llm nodes and tool nodes whose tool is idempotent are tried again."""
    if node.kind == "llm":
        return True
    if tools is not None:
        tool = next((t for t in tools if t.name == node.tool), None)
    else:
        tool = resolvable_tools(run.tenant_id).filter(name=node.tool).only("idempotent").first()
    return bool(tool is not None and getattr(tool, "idempotent", False))


def _execute(run: Run, flow: FlowDefinition, node: BodyNode, inputs: dict[str, Any], scope: dict[str, Any],
             audit: StepAudit, span: str, trace: list[Event], row_id: str, wave: Wave | None = None,
             started: Started | None = None) -> tuple[Any, list[str]]:
    if node.kind == "switch":
        try:
            chosen = choose(node, scope)
        except (JMESPathError, ValueError) as exc:  # a type error in a condition (abs of a text), a value too large
            raise NodeFailed(f"a case's condition could not be evaluated: {exc}") from None
        return {"chosen": chosen}, chosen
    if node.kind == "tool":
        return _tool(run, flow, node, inputs, audit, span, trace, row_id, wave, started), []
    if node.kind == "llm":
        return _llm(run, node, scope, span, trace), []
    if node.kind == "agent":
        return _agent(run, node, inputs, trace, span), []
    raise NodeFailed(f"{node.kind} nodes do not run yet in this version of the console")


class _Raises:
    """A call whose beginning raised: collecting it raises the same error, as if it had been raised there."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def result(self) -> Any:
        raise self.error


@dataclass
class Started:
    """A tool node's call, begun (:func:`_start_tool`) and collected by :func:`_tool`: in a wave, every first
    attempt is begun before any is collected (:func:`_start_tools`)."""

    call: ToolCall
    pending: PendingCall | _Raises
    began: float


def _start_tool(run: Run, flow: FlowDefinition, node: BodyNode, inputs: dict[str, Any], audit: StepAudit, span: str,
                row_id: str, wave: Wave | None = None) -> Started:
    """Every gateway stage of the node's call, a write's ``started`` row and the hand-off to its bulkhead. An error
    on the way is kept and raised when the call is collected (:func:`_tool`), as if the node had raised it there."""
    try:
        if wave is not None:
            tools, grants = wave.tools, wave.grants
        else:  # a node task: its own tool, and the conversation's grants only when the tool asks for scopes
            tools = _named_tools(run.tenant_id, [node.tool])
            grants = session_grants(run) if any(t.required_scopes for t in tools) else set()
        # a node task read its tool just now (above): its policy is decided from that row, not read again
        policy = wave.tool_policy if wave is not None else tool_allowed_as_read
        gateway = ToolGateway(run=run, tools=tools, audit=audit, grants=grants, approvals=ApprovalGate(run),
                              tool_policy=policy)
        gateway.whitelist = flow.tool_names()  # the flow's tool nodes are its tool list
        call = ToolCall(id=call_id(run.pk, row_id), name=node.tool or "", arguments=json.dumps(inputs, default=str))
        began = time.monotonic()
        return Started(call, gateway.start(call, ToolContext(run_id=str(run.pk), step=run.step, span_id=span,
                                                                   call_key=call.id)), began)
    except Exception as exc:
        return Started(ToolCall(id=call_id(run.pk, row_id), name=node.tool or "", arguments="{}"), _Raises(exc),
                       time.monotonic())


def _tool(run: Run, flow: FlowDefinition, node: BodyNode, inputs: dict[str, Any], audit: StepAudit, span: str,
          trace: list[Event], row_id: str, wave: Wave | None = None, started: Started | None = None) -> Any:
    if started is None:
        started = _start_tool(run, flow, node, inputs, audit, span, row_id, wave)
    call, outcome = started.call, started.pending.result()
    trace.append(Event("tool.call", {"tool": node.tool, "call_id": call.id, "status": str(outcome.status),
                                     "latency_ms": int((time.monotonic() - started.began) * 1000), "node": node.id},
                       parent_span_id=span))
    if outcome.status == ToolStatus.PENDING_APPROVAL:
        raise NodeWaits(outcome.content)
    if outcome.status != ToolStatus.OK:
        raise NodeFailed(f"{outcome.status}: {outcome.content}")
    try:
        return json.loads(outcome.content)
    except ValueError:
        return outcome.content


def _llm(run: Run, node: BodyNode, scope: dict[str, Any], span: str, trace: list[Event]) -> Any:
    """One model call through the tenant's model gateway (the deterministic planner serves ``demo/planner``)."""
    from agents.model_clients import model_client_for

    try:
        prompt = render(node.prompt or "", scope)
    except (JMESPathError, ValueError) as exc:
        raise NodeFailed(f"the prompt could not be rendered: {exc}") from None
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    if node.output_schema:
        messages.insert(0, {"role": "system", "content": "Reply with JSON only, no prose around it, matching this JSON "
                            f"Schema: {json.dumps(node.output_schema, ensure_ascii=False)}"})
    metadata: dict[str, Any] = {"run_id": str(run.pk), **({"output_schema": node.output_schema} if node.output_schema else {})}
    request = ModelRequest(model=node.model or run.version.model, tools=[], task="summarize", messages=messages,
                           metadata=metadata)
    began = time.monotonic()
    response = model_client_for(run).complete(request)
    trace.append(Event("model.call", {"model": response.model, **response.usage.to_dict(), "node": node.id,
                                      "latency_ms": int((time.monotonic() - began) * 1000)}, parent_span_id=span))
    if node.output_schema:
        return _checked_reply(node.output_schema, response.content or "")
    return response.content or ""


def _checked_reply(schema: dict[str, Any], content: str) -> Any:
    """The model's reply as the JSON its node's ``output_schema`` asks for; ``NodeFailed`` saying where it is not."""
    from runtime.schemas import CheckError, problems_of

    try:
        value = json.loads(content)
    except ValueError:
        raise NodeFailed("the model's reply is not the JSON the node's output_schema asks for") from None
    try:
        problems = problems_of(schema, value)
    except CheckError as exc:
        raise NodeFailed(f"the model's reply could not be checked against the node's output_schema: {exc}") from None
    if problems:
        shown = "; ".join(f"{'/'.join(map(str, p.absolute_path)) or 'the reply'}: {p.message}"[:200] for p in problems[:3])
        raise NodeFailed(f"the model's reply does not match the node's output_schema ({mask_text(shown)})")
    return value


def _agent(run: Run, node: BodyNode, inputs: dict[str, Any], trace: list[Event], span: str) -> Any:
    """A child run of the tenant's agent, linked to the flow run (``facts.parent_run``, the row's ``child_run``); the
    node waits for it to end (at most its ``timeout_seconds``). A restarted node waits for the child it started."""
    from agents.models import Agent, AgentKind
    from agents.services import RunRefused, execute_run, start_run
    from tenants.scoping import Actor

    row = FlowNodeRun.objects.get(run=run, node_id=node.id)
    child_id = row.child_run_id
    if child_id is None:
        agent = Agent.objects.for_tenant(run.tenant_id).select_related("tenant").filter(
            slug=node.agent, kind=AgentKind.AGENT).first()
        if agent is None:
            raise NodeFailed(f"there is no agent {node.agent!r} in this tenant")
        text = inputs.get("input") if isinstance(inputs.get("input"), str) else json.dumps(inputs, ensure_ascii=False)
        try:
            with transaction.atomic():
                child = start_run(actor=Actor(user=run.created_by, api_key=run.api_key), agent=agent, text=text or "")
                facts = {**child.facts, "parent_run": str(run.pk), "parent_flow": run.agent.slug, "flow_node": node.id}
                Run.objects.filter(pk=child.pk).update(facts=facts)
                FlowNodeRun.objects.filter(pk=row.pk).update(child_run=child)
        except RunRefused as exc:
            raise NodeFailed(f"the agent {node.agent!r} refused the request: {exc}") from None
        child_id = child.pk
        trace.append(Event("flow.child_run", {"node": node.id, "agent": node.agent, "child_run": str(child_id)},
                           parent_span_id=span))
    # here if no worker took it yet (in the node's place: not admitted again); its lease decides, so a duplicate does nothing
    execute_run(str(child_id), in_place=True)
    deadline = time.monotonic() + node.timeout_seconds
    while (done := Run.objects.get(pk=child_id)).status != RunStatus.FINISHED:
        if done.status == RunStatus.WAITING:  # a person decides first: the node waits with its task (worker) freed;
            # the child's end re-queues the flow run (agents.services.resume_parent) and this node runs again
            raise NodeWaits(f"child run {child_id} of {node.agent!r} waits for an approval")
        if time.monotonic() > deadline:
            raise NodeFailed(f"timeout: child run {child_id} ({done.status}) did not end in {node.timeout_seconds:g}s")
        time.sleep(0.2)
    if done.terminal_reason != TerminalReason.FINAL_ANSWER.value:
        raise NodeFailed(f"child run {child_id} of {node.agent!r} ended {done.terminal_reason}: {done.error or 'no answer'}")
    return {"answer": done.output, "child_run": str(child_id), "agent": node.agent}


def _wait(run: Run) -> None:
    """Nothing can run until a person decides: the run waits (no lease), its worker is free."""
    rows = _append(run, [Event("state.transition", {"from": "running", "to": "waiting"})])
    Run.objects.filter(pk=run.pk).update(status=RunStatus.WAITING, phase="waiting", lease_token="", lease_expires_at=None)
    run.status = RunStatus.WAITING
    publish_after_commit(run, rows, run_summary(run))


def _finish(run: Run, flow: FlowDefinition, outcome: str, failed_node: str | None, rows: dict[str, FlowNodeRun],
            writes: Writes) -> None:
    scope = _scope(run, rows)
    if outcome == "succeeded":
        try:
            value = evaluate(flow.output, scope) if flow.output else scope["nodes"]
        except Exception as exc:
            value, outcome, failed_node = None, "failed", f"output ({exc})"
    reason = TerminalReason.FINAL_ANSWER if outcome == "succeeded" else TerminalReason.ERROR
    now = timezone.now()
    error = "" if outcome == "succeeded" else mask_text(
        f"node {failed_node} failed: {rows[failed_node].error if failed_node in rows else ''}")
    output = mask_text(_text(value)) if outcome == "succeeded" else ""  # the rule of the trace and of agents' answers
    events = [Event("run.finished", {"terminal_reason": reason.value, "output": _summary(output) or None,
                                      "reason": error or None})]
    erows = writes.append(events)
    writes.update_run(status=RunStatus.FINISHED, terminal_reason=reason.value, phase="finished", output=output,
                      error=error, finished_at=now, lease_token="", lease_expires_at=None)
    publish_after_commit(run, erows, run_summary(run))
    transaction.on_commit(lambda: _ended_here(str(run.pk)))  # once it is committed: see run_flow


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
