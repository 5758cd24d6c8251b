"""The runtime's RunStore on the database: one transaction per step, constant queries per step.

A step commits: the run row (checkpoint, counters, status) under a row lock, its events
(seq allocated from ``Run.last_seq``), its appended messages and the audit rows of its tool
calls. Nothing grows with the conversation: messages are appended, never re-saved. The
step's events reach websocket clients after commit, in one batch.

On PostgreSQL a step after one this store committed is ONE autocommitted statement: its writes wait on a guard
that locks the run's row (and the tenant's audit chain head) and finds it only if it is as this store's last commit
left it (lease, step, event and message counters, chain head), so the events' numbers and the rows' seals computed
here from what the store remembers are right, or nothing is written and the step takes the locked way (BEGIN, lock
and read, write, COMMIT), which sees what another writer changed. The first step of a worker's hold, the last step
of a run and a step that marks the run for an operator take the locked way.

Locks follow ``audit/chain.py``'s one order (the run's row, the tenant's, the chain head): a step locks its run's row
and the chain head, never the tenant's row; its rows' foreign keys to the tenant are checked at commit with a KEY
SHARE lock, which a flow's ``FOR NO KEY UPDATE`` of the tenant does not block. A step whose commit loses a deadlock
or a serialization failure anyway is committed again (``core/conflicts.py``), not turned into a failed run.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agents import attention, metrics, otel
from agents.models import Run, RunEvent, RunMessage, RunStatus, Session, Turn
from agents.serializers import event_frames
from audit.masking import mask_text, mask_value
from audit.models import AuditChainHead
from audit.unit_of_work import StepAudit
from core import live
from core.batch import WriteBatch
from core.conflicts import retried
from runtime.protocols import Checkpoint, StepAck, StepRecord
from runtime.types import Event, Phase, Usage


def _when(at: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(at, tz=dt.UTC)


def _error_text(record: StepRecord) -> str:
    """Why a run failed, for operators (the ``run.finished`` event's reason); empty unless it ended in error."""
    if record.terminal_reason is None or record.terminal_reason.value != "error":
        return ""
    finished = next((e for e in reversed(record.events) if e.type == "run.finished"), None)
    return mask_text(str((finished.payload.get("reason") if finished else "") or "error"))[:2000]  # as the event shows it


def masked_output(record: StepRecord) -> str:
    """The answer as the run and the session's turn store it: masked by the trace's and the deltas' rule (mask_text),
    so the API, the console and the next run's context read what the trace and a streaming client saw."""
    return mask_text(record.output or "")


def status_for(phase: Phase) -> str:
    if phase == Phase.FINISHED:
        return RunStatus.FINISHED
    if phase == Phase.WAITING:
        return RunStatus.WAITING
    return RunStatus.RUNNING


def run_summary(run: Run | dict[str, Any]) -> dict[str, Any]:
    get = run.get if isinstance(run, dict) else lambda k, d=None: getattr(run, k, d)
    return {
        "id": str(get("id")),
        "status": get("status"),
        "terminal_reason": get("terminal_reason") or None,
        "step": get("step"),
        "usage": get("usage") or {},
        "needs_attention": bool(get("needs_attention", False)),
    }


def event_rows(run: Run, first_seq: int, step: int, events: Iterable[Event]) -> list[RunEvent]:
    tenant_id, run_id = run.tenant_id, run.pk
    return [RunEvent(tenant_id=tenant_id, run_id=run_id, seq=first_seq + offset, step=step, type=event.type,
                     span_id=event.span_id, parent_span_id=event.parent_span_id or "", payload=mask_value(event.payload),
                     at=_when(event.at))
            for offset, event in enumerate(events)]


def publish_after_commit(run: Run, rows: list[RunEvent], summary: dict[str, Any]) -> None:
    metrics.observe_committed(run, rows)  # counted on commit, from the committed rows (agents/metrics.py)
    otel.observe_committed(run, rows)  # spans on commit, from the same rows; off without OTEL_EXPORTER_OTLP_ENDPOINT (agents/otel.py)
    run_id, tenant_id = run.pk, run.tenant_id
    if live.unwatched(run_id, tenant_id):
        return  # nobody watches the run or the tenant's list, as the layer knows without asking: nothing to frame
    frames = event_frames(rows)
    transaction.on_commit(lambda: live.publish_run_events(run_id=run_id, tenant_id=tenant_id, frames=frames, summary=summary))


def _with_attention_events(events: list[Event], reasons: list[dict[str, Any]], writes: list[Any]) -> list[Event]:
    """The step's events with a ``run.needs_attention`` event per reason, under its tool call, before ``run.finished``."""
    if not reasons:
        return events
    spans = {w.started_pk: w.row.span_id for w in writes if w.started_pk is not None and w.row.span_id}
    marks = attention.events_for(reasons, spans=spans)
    end = next((i for i, e in enumerate(events) if e.type == "run.finished"), len(events))
    return [*events[:end], *marks, *events[end:]]


_LOCKED_FIELDS = ("last_seq", "message_count", "step", "lease_token", "cancel_requested", "attention_reasons")


def _lock_sql(with_head: bool) -> str:
    """The run's row (and the tenant's audit chain head) locked and read, one statement; its text fixed.
    PostgreSQL only (``FOR UPDATE OF``); names from the models' metadata, quoted by the backend; the one value a
    parameter."""
    q, run, head = connection.ops.quote_name, Run._meta, AuditChainHead._meta
    columns = ", ".join(f"r.{q(run.get_field(name).column)}" for name in _LOCKED_FIELDS)
    if not with_head:
        return f"SELECT {columns} FROM {q(run.db_table)} r WHERE r.{q(run.pk.column)} = %s FOR UPDATE OF r"  # noqa: S608
    return (
        f"SELECT {columns}, h.{q(head.get_field('seq').column)}, h.{q(head.get_field('hash').column)} "  # noqa: S608
        f"FROM {q(run.db_table)} r JOIN {q(head.db_table)} h ON h.{q(head.pk.column)} = r.{q(run.get_field('tenant').column)} "
        f"WHERE r.{q(run.pk.column)} = %s FOR UPDATE OF r, h"
    )


_LOCK_SQL = {True: _lock_sql(True), False: _lock_sql(False)}


@dataclass
class _Known:
    """What this store's last commit left in the run's row (and the tenant's audit chain head, when it wrote there):
    the next step may commit in one statement that checks, under its locks, that nothing else changed them."""

    step: int
    last_seq: int
    message_count: int
    head: tuple[int, str] | None  # (seq, hash) after this store's last audit rows; None: not known here


def guard_sql(equal: tuple[str, ...], *, with_head: bool, uncancelled: bool = False) -> str:
    """A one-statement commit's guard (``WriteBatch.execute_guarded``): the run's row (and the tenant's audit chain
    head) locked, found only if they are as the committer last left them: the run's ``equal`` fields and the head's
    seq and hash equal to the parameters that follow the run's id, in that order; with ``uncancelled``, only while
    no cancel was asked. It selects ``cancel_requested``. Names from the models' metadata; every value a parameter."""
    q, run, head = connection.ops.quote_name, Run._meta, AuditChainHead._meta

    def r(name: str) -> str:
        return f"r.{q(run.get_field(name).column)}"

    sql = f"SELECT {r('cancel_requested')} FROM {q(run.db_table)} r"  # noqa: S608
    if with_head:
        sql += f" JOIN {q(head.db_table)} h ON h.{q(head.pk.column)} = {r('tenant')}"
    sql += f" WHERE r.{q(run.pk.column)} = %s" + "".join(f" AND {r(name)} = %s" for name in equal)
    if uncancelled:
        sql += f" AND NOT {r('cancel_requested')}"
    if with_head:
        sql += f" AND h.{q(head.get_field('seq').column)} = %s AND h.{q(head.get_field('hash').column)} = %s"
    return sql + " FOR UPDATE OF r" + (", h" if with_head else "")


#: The step's guard: its lease still held, the run's counters as this store's last commit left them.
_STEP_GUARD = ("lease_token", "step", "last_seq", "message_count")
_GUARD_SQL = {True: guard_sql(_STEP_GUARD, with_head=True), False: guard_sql(_STEP_GUARD, with_head=False)}


def _locked_session(pk: Any) -> Session:
    """The session's counters, its row locked until the step commits."""
    return Session.objects.select_for_update().only("usage", "model_calls", "turns").get(pk=pk)


class DjangoRunStore:
    """Implements ``runtime.protocols.RunStore`` for one run held under a lease."""

    def __init__(self, run: Run, lease_token: str, *, initial: Callable[[], Checkpoint], audit: StepAudit) -> None:
        self.run = run
        self.lease_token = lease_token
        self.initial = initial
        self.audit = audit  # the step's audit rows, added by the tool gateway, committed (or dropped) here
        self._known: _Known | None = None  # set by each commit: the next step may commit in one statement
        #: a guarded commit found another writer had come between (most often another run of the tenant sealing audit
        #: rows): the tenant is busy, so this store's later steps take the locked way instead of paying a statement
        #: that writes nothing each time
        self._contended = False
        self._lease_written: float | None = None  # time.monotonic() of this store's last commit renewing the lease

    def load(self, run_id: str) -> Checkpoint:
        """A fresh run gets its assembled context; a resumed one its committed log and checkpoint."""
        run = self.run
        if run.step == 0:
            return self.initial()
        messages = list(RunMessage.objects.filter(run_id=run.pk).order_by("index").values_list("message", flat=True))
        return Checkpoint(
            step=run.step,
            phase=Phase(run.phase),
            messages=messages,
            state=dict(run.state),
            usage=Usage.from_dict(run.usage),
            pending_calls=list(run.pending_calls),
            cancel_requested=run.cancel_requested,
        )

    def commit_step(self, run_id: str, record: StepRecord) -> StepAck:
        """The step's writes in one transaction: in ONE statement when this store committed the run's previous step
        and the step neither ends the run nor marks it for attention (:meth:`_commit_guarded`); else the run's row
        (and chain head) locked and read first, then the writes (:meth:`_commit_locked`). A commit that lost a
        deadlock or serialization failure wrote nothing: it is made again, the locked way (``core/conflicts.py``)."""
        writes, tries = self.audit.pending, []

        def commit() -> StepAck:
            if tries:  # the last try was rolled back: its audit rows are sealed again, after the head as it is now
                self.audit.restore(writes)
                self._known, self._lease_written = None, None
            tries.append(1)
            return self._commit(record)

        return retried(commit, what=f"run {run_id}'s step {record.step}")

    def _commit(self, record: StepRecord) -> StepAck:
        now = timezone.now()
        if self._may_guard(record):
            ack = self._commit_guarded(record, now)
            if ack is not None:
                return ack
        return self._commit_locked(record, now)

    def _may_guard(self, record: StepRecord) -> bool:
        known = self._known
        return (known is not None and not self._contended and known.step == record.step - 1 and record.phase != Phase.FINISHED
                and (known.head is not None or len(self.audit) == 0)
                and connection.vendor == "postgresql" and not connection.in_atomic_block)

    def _commit_guarded(self, record: StepRecord, now: Any) -> StepAck | None:
        """One autocommitted statement: it writes only if the run's row (and the tenant's chain head, for audit rows)
        is as this store's last commit left it, under their locks; None when it wrote nothing (another writer came
        between: the caller commits the locked way, which reads what changed)."""
        run, known = self.run, self._known
        assert known is not None
        if attention.reasons_for_writes(self.audit.pending, at=now):
            return None  # marks the run for an operator: the locked way, which merges the run's reasons
        writes = self.audit.pending
        head = AuditChainHead(tenant_id=run.tenant_id, seq=known.head[0], hash=known.head[1]) if writes and known.head else None
        batch, rows, changes = self._step_writes(record, record.events, now, known.last_seq, known.message_count, head)
        batch.update_where(Run, {"id": run.pk}, **changes)
        if not batch.can_guard():
            for write in writes:
                self.audit.add(write)
            return None
        params = [run.pk, self.lease_token, record.step - 1, known.last_seq, known.message_count]
        if head is not None:
            params += list(known.head)  # type: ignore[arg-type]
        found = batch.execute_guarded(_GUARD_SQL[head is not None], params)
        if found is None:
            for write in writes:  # nothing was written: the locked way seals them again after the real head
                self.audit.add(write)
            self._known, self._contended = None, True
            return None
        self._committed(changes)
        self._known = _Known(record.step, changes["last_seq"], changes["message_count"],
                             (head.seq, head.hash) if head is not None else known.head)
        publish_after_commit(run, rows, run_summary(run))  # committed already: published now
        return StepAck(cancel_requested=bool(found[0]))

    def _step_writes(self, record: StepRecord, events: list[Event], now: Any, last_seq: int, message_count: int,
                     head: AuditChainHead | None) -> tuple[WriteBatch, list[RunEvent], dict[str, Any]]:
        """The step's events, messages and sealed audit rows in one batch, numbered after ``last_seq`` and
        ``message_count``, and the run row's changes (the caller adds their update, with its own additions)."""
        run = self.run
        batch = WriteBatch()
        rows = event_rows(run, last_seq + 1, record.step, events)
        batch.insert(RunEvent, rows)
        batch.insert(RunMessage, (
            RunMessage(tenant_id=run.tenant_id, run_id=run.pk, index=message_count + i, step=record.step, message=m)
            for i, m in enumerate(record.appended_messages)
        ))
        self.audit.commit(run.tenant_id, batch, head)  # seals the rows after ``head``; its writes join the batch
        return batch, rows, self._changes(record, now, last_seq=last_seq + len(rows),
                                          message_count=message_count + len(record.appended_messages))

    def _changes(self, record: StepRecord, now: Any, *, last_seq: int, message_count: int) -> dict[str, Any]:
        return {
            "step": record.step,
            "phase": record.phase.value,
            "state": record.state,
            "pending_calls": record.pending_calls,
            "usage": record.usage.to_dict(),
            "last_seq": last_seq,
            "message_count": message_count,
            "status": status_for(record.phase),
            **self._lease_renewal(now),
            "updated_at": now,
        }

    def _lease_renewal(self, now: Any) -> dict[str, Any]:
        """The lease's new expiry, when a third of it has passed since this store last wrote it (its first commit
        always does); else nothing. The heartbeat renews it as often (agents/lease.py), so a committed step leaves at
        least two thirds of the lease ahead either way. Left alone, the run's row changes no indexed column from one
        step to the next, and PostgreSQL updates it in place (a HOT update, the table's fillfactor leaves room):
        not a new entry in each of the run table's indexes every step."""
        if self._lease_written is not None and time.monotonic() - self._lease_written < settings.RUN_LEASE_SECONDS / 3:
            return {}
        return {"lease_expires_at": now + dt.timedelta(seconds=settings.RUN_LEASE_SECONDS)}

    def _committed(self, changes: dict[str, Any]) -> None:
        """The run's row in memory follows the commit; the lease's renewal time too."""
        for field, value in changes.items():
            setattr(self.run, field, value)
        if "lease_expires_at" in changes:
            self._lease_written = time.monotonic()

    def _commit_locked(self, record: StepRecord, now: Any) -> StepAck:
        run = self.run
        with transaction.atomic():
            locked, head = self._lock(run, chain_head=len(self.audit) > 0)
            if locked is None or locked["lease_token"] != self.lease_token or locked["step"] != record.step - 1:
                self.audit.discard()
                return StepAck(lease_lost=True)
            # A write whose outcome is unknown marks the run for an operator, with this step (agents/attention.py).
            reasons = attention.reasons_for_writes(self.audit.pending, at=now)
            events = _with_attention_events(record.events, reasons, self.audit.pending)
            wrote_audit = len(self.audit) > 0
            # The step's writes go out together: one statement on PostgreSQL (core/batch.py).
            batch, rows, changes = self._step_writes(record, events, now, locked["last_seq"], locked["message_count"], head)
            finished = record.phase == Phase.FINISHED
            if reasons:
                changes.update(needs_attention=True, attention_reasons=attention.with_reasons(locked["attention_reasons"], reasons))
            if finished:
                changes.update(
                    terminal_reason=record.terminal_reason.value if record.terminal_reason else "error",
                    output=masked_output(record),
                    error=_error_text(record),
                    finished_at=now,
                    lease_token="",
                    lease_expires_at=None,
                )
            batch.update_where(Run, {"id": run.pk}, **changes)
            if finished:
                self._close_session_turn(run, record, batch, now, answer=changes["output"])
            batch.execute()
            self._committed(changes)
            publish_after_commit(run, rows, run_summary(run))
        # the head is known here only when this commit locked and read it (PostgreSQL, audit rows, head existing)
        known_head = (head.seq, head.hash) if wrote_audit and head is not None else None
        self._known = None if finished else _Known(record.step, changes["last_seq"], changes["message_count"], known_head)
        return StepAck(cancel_requested=bool(locked["cancel_requested"]))

    def _lock(self, run: Run, *, chain_head: bool) -> tuple[dict[str, Any] | None, AuditChainHead | None]:
        """Lock the run row (and, for a step with audit rows, the tenant's audit chain head) and read them.

        On PostgreSQL both rows in one statement once the head exists; otherwise the run row here and the
        head in ``audit.chain.write_sealed`` (which creates it on the tenant's first row). Either way both
        locks are held from here to the commit, the run row's taken first.
        """
        if connection.vendor != "postgresql":
            return Run.objects.select_for_update().filter(pk=run.pk).values(*_LOCKED_FIELDS).first(), None
        for with_head in (True, False) if chain_head else (False,):  # a tenant's first audit row: no head yet
            with connection.cursor() as cursor:
                cursor.execute(_LOCK_SQL[with_head], [run.pk])
                row = cursor.fetchone()
            if row is None:
                continue
            locked = dict(zip(_LOCKED_FIELDS, row[: len(_LOCKED_FIELDS)], strict=True))
            reasons = locked["attention_reasons"]  # a raw cursor leaves jsonb as its text (the field decodes it)
            locked["attention_reasons"] = json.loads(reasons) if isinstance(reasons, str) else reasons
            if not with_head:
                return locked, None
            seq, hash_ = row[len(_LOCKED_FIELDS):]
            return locked, AuditChainHead(tenant_id=run.tenant_id, seq=seq, hash=hash_)
        return None, None

    def _close_session_turn(self, run: Run, record: StepRecord, batch: WriteBatch, now: Any, *, answer: str) -> None:
        """Append the exchange to the session's conversation and carry the run's counters over: the session's row
        locked and read here (its turn number), its update and the turn's row sent with the step's batch. ``answer``:
        the run's output as stored (masked once, see :func:`masked_output`)."""
        session = _locked_session(run.session_id)
        usage, model_calls, turns = dict(session.usage or {}), session.model_calls, session.turns
        run_usage = record.usage.to_dict()
        for key in ("input_tokens", "output_tokens"):
            usage[key] = int(usage.get(key, 0)) + int(run_usage.get(key, 0))
        usage["cost"] = round(float(usage.get("cost", 0.0)) + float(run_usage.get("cost", 0.0)), 10)
        usage["wall_seconds"] = round(float(usage.get("wall_seconds", 0.0)) + float(record.state.get("_active_seconds", 0.0)), 3)
        turns += 1
        batch.update_where(Session, {"id": run.session_id}, usage=usage, turns=turns, updated_at=now,
                           model_calls=model_calls + int(record.state.get("llm_call_count", 0)))
        batch.insert(Turn, [Turn(tenant_id=run.tenant_id, session_id=run.session_id, turn_seq=turns, run_id=run.pk,
                                 user_message=run.input, assistant_message=answer, created_at=now)])
