"""The tool gateway: every tool call of every run goes through this one pipeline.

resolve → authorize → validate → duplicate guard → rate limit → approval gate → execute → shape → audit.

Each stage leaves an entry in the trace and each call exactly one audit row. Whatever goes
wrong becomes a ToolOutcome the model can read, never an exception into the loop.

Side-effecting (``write``) calls are exactly-once: before one runs, its audit row is committed
as ``started`` with an idempotency key derived from the call's identity. That identity is the
caller's stable key when it has one (``ToolContext.call_key``: a flow node's call id, the same on
every attempt while the run's step counter moves on), else the run's step and the call (an agent
step is re-run under its number until it commits). If the worker dies before the completion
commits, the next attempt finds that row by the identity: an idempotent tool runs again with the
same key (an HTTP target dedupes on ``Idempotency-Key``); a non-idempotent one is not re-run and
is reported as ``outcome_unknown`` to the model and the operator (the run is marked for attention).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from audit.masking import mask_value, summarize_arguments
from audit.models import ToolCallAudit, ToolCallStatus
from audit.unit_of_work import StepAudit
from core.buckets import bucket_store
from runtime.documents import problems as document_problems
from runtime.serde import without_nul
from runtime.types import ToolCall, ToolContext, ToolOutcome, ToolStatus
from tools import bulkhead, decisions, rate_limits
from tools.arguments import arguments_hash, parse_arguments
from tools.executors import ExecContext, ToolFailure
from tools.kinds import executor_for, kind_for
from tools.models import Tool, ToolCategory
from tools.shaping import shape_result

#: After this many invalid calls in a row to one tool, the model is told to stop trying.
MAX_REPAIRS = 2
#: Call ids are kept up to this length in ``attempt_call_ids`` (``call_id`` itself holds 100 characters).
MAX_CALL_ID = 256


def _duplicate_window(tool: Tool) -> float:
    """The config's ``duplicate_window_seconds`` (typed), else the setting; a config that does not parse gets the setting."""
    kind = kind_for(tool.kind)
    config = document_problems(kind.config_model, tool.config or {})[0] if kind is not None else None
    window = config.duplicate_window_seconds if config is not None else None
    return window if window is not None else settings.TOOL_DUPLICATE_WINDOW_SECONDS


def attempt_ids(started: ToolCallAudit, call_id: str) -> list[str]:
    """The ids of every attempt of a write, first first, ending with ``call_id`` (this attempt's).

    A step resumed after a crash asks the model again, which names the same call with a new id; the
    message log holds only the last attempt's. The completed row's ``call_id`` is that last id and
    ``attempt_call_ids`` lists them all, so the transcript joins on ``tool_call_id IN attempt_call_ids``.
    """
    ids = [str(i) for i in (started.attempt_call_ids or [started.call_id]) if i]
    current = call_id[:MAX_CALL_ID]
    return ids if ids and ids[-1] == current else [*ids, current]


def _note_attempt(started: ToolCallAudit, call_id: str) -> None:
    """Record a resumed attempt's id on its ``started`` row at once, so a further crash does not lose it."""
    ids = attempt_ids(started, call_id)
    if ids != list(started.attempt_call_ids or []):
        ToolCallAudit.objects.filter(pk=started.pk, status=ToolCallStatus.STARTED).update(attempt_call_ids=ids)
        started.attempt_call_ids = ids


@dataclass
class AuditWrite:
    """An audit row the step will commit: a new row, or the completion of a ``started`` one."""

    row: ToolCallAudit
    started_pk: int | None = None


@dataclass
class _Call:
    call: ToolCall
    ctx: ToolContext
    started: float = field(default_factory=time.perf_counter)
    trace: list[dict[str, Any]] = field(default_factory=list)
    tool: Tool | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    args_hash: str = ""
    started_row: ToolCallAudit | None = None
    idempotency_key: str = ""
    edit_note: str = ""  # an approver edited the arguments: told to the model with the result

    def stage(self, name: str, ok: bool, **details: Any) -> None:
        self.trace.append({"type": "tool.stage", "stage": name, "ok": ok, **details})


class PendingCall:
    """A call :meth:`ToolGateway.start` began: refused or answered already (``outcome``), or running on its bulkhead's
    thread (``future``). :meth:`result` gives its outcome once, audited in the gateway's step
    (``runtime.protocols.PendingTool``)."""

    def __init__(self, gateway: ToolGateway, s: _Call, *, outcome: ToolOutcome | None = None,
                 slot: bulkhead.Slot | None = None, future: Future[Any] | None = None, deadline: float = 0.0,
                 stopped: bool = False) -> None:
        self.gateway, self._s, self._outcome, self._stopped = gateway, s, outcome, stopped
        self._slot, self._future, self._deadline = slot, future, deadline
        self._audited: ToolOutcome | None = None

    def settled(self) -> ToolOutcome | None:
        """The outcome when the call was decided without running (refused by a stage, waiting for an approval, no
        slot); None while it runs."""
        return self.result() if self._future is None else None

    def result(self) -> ToolOutcome:
        if self._audited is None:
            outcome = self._outcome
            if outcome is None:
                assert self._slot is not None and self._future is not None
                outcome = self.gateway._collect(self._s, self._slot, self._future, self._deadline)
            if self._s.edit_note and not self._stopped:  # an approver's edit, told with whatever the run came to
                outcome.content = f"{self._s.edit_note}\n\n{outcome.content}"
            self._audited = self.gateway._audit(self._s, outcome)
        return self._audited


class ToolGateway:
    """Implements ``runtime.protocols.ToolExecutor`` (and ``StartsTools``) for one run."""

    def __init__(
        self,
        *,
        run: Any,
        tools: list[Tool],
        audit: StepAudit,
        grants: set[str] | None = None,
        approvals: Any = None,
        tool_policy: Any = None,
        bucket_store: Any = None,
    ) -> None:
        self.run = run
        self.tools = {t.name: t for t in tools}
        self.audit = audit  # the step's unit of work: the run store commits these rows with the step
        self.whitelist = {n for n in run.version.tools if isinstance(n, str)}
        self.grants = set(grants or ())
        self.approvals = approvals
        self.tool_policy = tool_policy
        self.invalid_streak: dict[str, int] = {}
        self.bucket_store = bucket_store  # None: the process's store, shared with the model gateway (Redis with REDIS_URL)

    # -- the pipeline ---------------------------------------------------------------------

    def execute(self, call: ToolCall, ctx: ToolContext) -> ToolOutcome:
        return self.start(call, ctx).result()

    def start(self, call: ToolCall, ctx: ToolContext) -> PendingCall:
        """The pipeline up to the tool running: every stage, the write's ``started`` row, the call handed to its
        bulkhead's thread; :meth:`PendingCall.result` waits for it (at most its timeout from when it was handed over) and audits it.
        Everything that reads or writes the database happens here, in the caller's thread, so a caller may start
        several calls and then collect them: they run side by side (a flow's inline wave does)."""
        s = _Call(call, ctx)
        stages = (self._resolve, self._authorize, self._validate, self._guard_duplicates, self._rate_limit, self._approval_gate)
        for stage in stages:
            outcome = stage(s)
            if outcome is not None:
                return PendingCall(self, s, outcome=outcome, stopped=True)
        return self._launch(s)

    def _resolve(self, s: _Call) -> ToolOutcome | None:
        tool = self.tools.get(s.call.name)
        if tool is None:
            s.stage("resolve", False, reason="unknown tool")
            names = ", ".join(sorted(t.name for t in self.tools.values() if t.enabled)) or "none"
            return self._fail(s, ToolStatus.DENIED, f"There is no tool named {s.call.name!r}. The tools you can call are: {names}.")
        s.tool = tool
        off = decisions.switched_off(tool)
        if off is not None:
            s.stage(off.stage, False, reason=off.reason)
            return self._fail(s, ToolStatus.DENIED, off.message)
        if self.tool_policy is not None:
            allowed, why = self.tool_policy(tool, self.run.tenant_id, str(self.run.session_id))
            if not allowed:
                s.stage("resolve", False, reason=why)
                return self._fail(s, ToolStatus.DENIED, why)  # the policy's reason is written for the model
        s.stage("resolve", True, kind=tool.kind, category=tool.category)
        return None

    def _authorize(self, s: _Call) -> ToolOutcome | None:
        tool = s.tool
        assert tool is not None
        refusal = decisions.not_authorized(tool, self.whitelist, self.grants)
        if refusal is not None:
            s.stage(refusal.stage, False, reason=refusal.reason, **refusal.details)
            return self._fail(s, ToolStatus.DENIED, refusal.message)
        s.stage("authorize", True)
        return None

    def _validate(self, s: _Call) -> ToolOutcome | None:
        tool = s.tool
        assert tool is not None
        parsed = parse_arguments(s.call.arguments, tool.parameters or {"type": "object", "properties": {}}, tool_name=tool.name)
        if not parsed.ok:
            streak = self.invalid_streak.get(tool.name, 0) + 1
            self.invalid_streak[tool.name] = streak
            s.stage("validate", False, errors=[p.message for p in parsed.errors], attempt=streak)
            message = parsed.model_message
            if streak >= MAX_REPAIRS:
                message += (
                    f" This was attempt {streak} with invalid arguments: stop calling {tool.name} for now and "
                    "ask the user for the missing or correct information."
                )
            return self._fail(s, ToolStatus.INVALID, message)
        self.invalid_streak.pop(tool.name, None)
        s.arguments = parsed.arguments
        s.args_hash = arguments_hash(parsed.arguments)
        s.stage("validate", True, repaired=bool(parsed.repaired), mapped=[list(m) for m in parsed.mapped])
        return None

    def _guard_duplicates(self, s: _Call) -> ToolOutcome | None:
        tool = s.tool
        assert tool is not None
        if tool.category != ToolCategory.WRITE:
            return None
        window = float(_duplicate_window(tool))
        # A write another call started (under way, or its completion lost: its outcome unknown) counts as done too;
        # this call's own earlier attempts do not (the ledger decides about those, in _begin_write).
        earlier = (
            ToolCallAudit.objects.filter(
                tenant_id=self.run.tenant_id,
                session_id=self.run.session_id,
                tool_name=tool.name,
                arguments_hash=s.args_hash,
                status__in=[ToolCallStatus.OK, ToolCallStatus.OUTCOME_UNKNOWN, ToolCallStatus.STARTED],
                created_at__gte=timezone.now() - timezone.timedelta(seconds=window),
            )
            .exclude(run_id=self.run.pk, step=s.ctx.step)
            .exclude(run_id=self.run.pk, call_id=s.ctx.call_key[:100] if s.ctx.call_key else s.call.id[:100],
                     status=ToolCallStatus.STARTED)
            .order_by("-created_at")
            .first()
        )
        if earlier is None:
            s.stage("duplicate_guard", True)
            return None
        s.stage("duplicate_guard", False, earlier_run=str(earlier.run_id), earlier_status=earlier.status)
        when = f"{earlier.created_at:%H:%M:%S} UTC"
        if earlier.status == ToolCallStatus.STARTED:
            done = (f"was started at {when} and may still be running, or its outcome is unknown. Do not repeat it; "
                    "tell the user it is under way and an operator will check it if it does not complete.")
        else:
            done = f"ran at {when} (status {earlier.status}). Do not repeat it; tell the user it was already done."
        return self._fail(s, ToolStatus.DUPLICATE_BLOCKED, f"You already did this: {tool.name} with the same arguments {done}")

    def _rate_limit(self, s: _Call) -> ToolOutcome | None:
        """Calls per minute per tenant per tool (``Tool.rate_limit_per_minute``), see :mod:`tools.rate_limits`.

        Here, after the duplicate guard and before the approval gate: a call refused earlier (unknown, not allowed,
        invalid, a duplicate) never runs and spends nothing; a limited call never creates an approval request and
        never runs. A call admitted once is not counted again when it comes back: the dispatch of its approval
        request, or the resumed attempt of a write whose ``started`` row a crash left behind.
        """
        tool = s.tool
        assert tool is not None
        limit = tool.rate_limit_per_minute
        if not limit:
            return None
        counted = self._admitted_before(s, tool)
        if counted:
            s.stage("rate_limit", True, limit_per_minute=limit, counted=False, reason=counted)
            return None
        if self.bucket_store is None:
            self.bucket_store = bucket_store()
        try:
            wait = decisions.rate_limit_wait(self.bucket_store, self.run.tenant_id, tool)
        except Exception as exc:  # the shared store is unreachable: no call goes past a limit nobody could check
            s.stage("rate_limit", False, limit_per_minute=limit, reason=f"the rate limit could not be checked ({type(exc).__name__})")
            return self._fail(s, ToolStatus.ERROR, f"The tool {tool.name} was not called: its rate limit could not be checked "
                                                   "just now. Try again later or continue without it.")
        if wait > 0:
            retry_in = max(1, math.ceil(wait)) if math.isfinite(wait) else 60
            s.stage("rate_limit", False, limit_per_minute=limit, retry_in_seconds=retry_in)
            return self._fail(s, ToolStatus.RATE_LIMITED, rate_limits.model_message(tool.name, limit, retry_in))
        s.stage("rate_limit", True, limit_per_minute=limit)
        return None

    def _admitted_before(self, s: _Call, tool: Tool) -> str:
        """Why this call was already counted against its tool's limit; empty when it was not."""
        if tool.category == ToolCategory.WRITE and self._earlier_attempts(s, tool).exists():
            return "the resumed attempt of a write cut off by a crash"
        if self.approvals is not None and self.approvals.requested(
            call_id=s.call.id[:100], tool_name=tool.name, args_hash=s.args_hash, step=s.ctx.step
        ):
            return "counted when its approval was requested"
        return ""

    def _approval_gate(self, s: _Call) -> ToolOutcome | None:
        if self.approvals is None:
            return None
        assert s.tool is not None
        decision = self.approvals.gate(tool=s.tool, call=s.call, ctx=s.ctx, arguments=s.arguments, args_hash=s.args_hash)
        if decision is None:
            return None
        s.stage("approval", decision.proceed, **decision.trace)
        if decision.proceed:
            if decision.arguments is not None:  # an approver's edit: run exactly the approved arguments
                s.arguments, s.args_hash, s.edit_note = decision.arguments, decision.args_hash, decision.message
            return None
        return self._fail(s, decision.status, decision.message)

    def _launch(self, s: _Call) -> PendingCall:
        tool = s.tool
        assert tool is not None
        if tool.category == ToolCategory.WRITE:
            unknown = self._begin_write(s)
            if unknown is not None:
                return PendingCall(self, s, outcome=unknown)
        # The call runs on a worker thread holding a slot of its tool's bulkhead until it really ends, past its
        # timeout too (tools/bulkhead.py); at the timeout its cancel signal is set and the model is told at once.
        timeout = float(tool.timeout_seconds)
        try:
            executor = executor_for(tool.kind)
            slot = bulkhead.admit(f"{tool.tenant_id}:{tool.name}", label=tool.name, wait=timeout)
        except bulkhead.BulkheadFull as full:
            s.stage("execute", False, reason=f"bulkhead full ({full.reason})", running=full.running, overrunning=full.overrunning)
            return PendingCall(self, s, outcome=self._fail(s, ToolStatus.ERROR, full.model_message(tool.name, timeout)))
        except ToolFailure as exc:
            s.stage("execute", False, reason=exc.status)
            return PendingCall(self, s, outcome=self._fail(s, ToolStatus(exc.status), str(exc)))
        context = ExecContext(
            tenant_id=self.run.tenant_id,
            run=self.run,
            step=s.ctx.step,
            call_id=s.call.id,
            span_id=s.ctx.span_id,
            idempotency_key=s.idempotency_key or None,
            cancel=slot.cancel,
            deadline=time.monotonic() + timeout,
        )
        return PendingCall(self, s, slot=slot, future=slot.run(executor, tool, s.arguments, context), deadline=context.deadline)

    def _collect(self, s: _Call, slot: bulkhead.Slot, future: Future[Any], deadline: float) -> ToolOutcome:
        """The running call's result, waited for until its deadline (its timeout from when it was handed over)."""
        tool = s.tool
        assert tool is not None
        try:
            result = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            slot.overran()
            s.stage("execute", False, reason="timeout", timeout_seconds=tool.timeout_seconds)
            return self._fail(
                s,
                ToolStatus.TIMEOUT,
                f"No result was obtained from {tool.name} within {tool.timeout_seconds:g} s. Do not tell the user it succeeded.",
            )
        except ToolFailure as exc:
            s.stage("execute", False, reason=exc.status)
            return self._fail(s, ToolStatus(exc.status), str(exc))
        except Exception as exc:
            s.stage("execute", False, reason=type(exc).__name__)
            return self._fail(s, ToolStatus.ERROR, f"The tool {tool.name} failed: {exc}")
        s.stage("execute", True, idempotency_key=s.idempotency_key or None)
        shaped = shape_result(
            without_nul(result),
            field_whitelist=tool.result_fields or None,
            size_cap=tool.result_size_cap,
            summary_template=tool.summary_template or None,
        )
        s.stage("shape", True, truncated=shaped.truncated, original_size=shaped.original_size, missing_fields=shaped.missing_fields)
        return ToolOutcome(s.call.id, ToolStatus.OK, shaped.content, trace=s.trace)

    def _earlier_attempts(self, s: _Call, tool: Tool) -> Any:
        """The ``started`` rows an earlier attempt of this same call left (its completion was lost). By the caller's
        stable key when it has one (a flow node's call: the run's step has moved on since), never by the step then;
        else within this step, by the call's id or, as a resumed step asks the model again and it names the call
        anew, by the same tool and arguments."""
        rows = ToolCallAudit.objects.filter(run_id=self.run.pk, status=ToolCallStatus.STARTED)
        if s.ctx.call_key:
            return rows.filter(call_id=s.ctx.call_key[:100])
        return rows.filter(Q(call_id=s.call.id[:100]) | Q(tool_name=tool.name, arguments_hash=s.args_hash), step=s.ctx.step)

    def _idempotency_key(self, s: _Call) -> str:
        """The key the target dedupes on, from the call's identity: the same on every attempt of the call."""
        if s.ctx.call_key:
            return f"{self.run.pk}:{s.ctx.call_key}"
        return f"{self.run.pk}:{s.ctx.step}:{s.call.id}"

    def _begin_write(self, s: _Call) -> ToolOutcome | None:
        """Commit the intent before a side effect; on a replayed attempt, reuse or refuse it."""
        tool = s.tool
        assert tool is not None
        previous = self._earlier_attempts(s, tool).order_by("pk").first()
        if previous is not None:
            s.started_row = previous
            s.idempotency_key = previous.idempotency_key
            _note_attempt(previous, s.call.id)
            if not tool.idempotent:
                s.stage("execute", False, reason="outcome unknown after a crash", idempotency_key=previous.idempotency_key)
                return self._fail(
                    s,
                    ToolStatus.OUTCOME_UNKNOWN,
                    f"An earlier attempt of {tool.name} was interrupted and may or may not have taken effect. "
                    "It was not repeated. Tell the user an operator will check, and do not call it again.",
                )
            s.stage("execute", True, replay=True, idempotency_key=previous.idempotency_key)
            return None
        s.idempotency_key = self._idempotency_key(s)
        s.started_row = self._row(s, ToolCallStatus.STARTED, error="", latency_ms=0, result_size=0)
        s.started_row.idempotency_key = s.idempotency_key
        s.started_row.save()  # autocommit: durable before the side effect
        return None

    # -- helpers --------------------------------------------------------------------------

    def _fail(self, s: _Call, status: ToolStatus, message: str) -> ToolOutcome:
        return ToolOutcome(s.call.id, status, without_nul(message), trace=s.trace)

    def _row(self, s: _Call, status: str, *, error: str, latency_ms: int, result_size: int) -> ToolCallAudit:
        tool = s.tool
        sensitive = set(tool.sensitive_fields or []) if tool is not None else set()
        run = self.run
        arguments = s.arguments if s.args_hash else {"_raw": s.call.arguments[:500]}
        return ToolCallAudit(**{
            "tenant_id": run.tenant_id,
            "run_id": run.pk,
            "agent_id": run.agent_id,
            "version_id": run.version_id,
            "session_id": run.session_id,
            "user_id": run.created_by_id,
            "api_key_id": run.api_key_id,
            "step": s.ctx.step,
            "call_id": s.call.id[:100],
            "attempt_call_ids": [s.call.id[:MAX_CALL_ID]],
            "span_id": s.ctx.span_id,
            "tool_name": s.call.name[:200],
            "arguments_summary": summarize_arguments(arguments, sensitive),
            "arguments_hash": s.args_hash or arguments_hash(arguments),
            "status": status,
            "error": error,
            "latency_ms": latency_ms,
            "result_size": result_size,
            "idempotency_key": s.idempotency_key,
        })

    def _audit(self, s: _Call, outcome: ToolOutcome) -> ToolOutcome:
        latency_ms = int((time.perf_counter() - s.started) * 1000)
        error = "" if outcome.status == ToolStatus.OK else str(mask_value(outcome.content[:2000]))
        row = self._row(s, outcome.status.value, error=error, latency_ms=latency_ms, result_size=len(outcome.content.encode()))
        if s.started_row is not None:
            row.created_at = s.started_row.created_at  # completing the started row keeps its time
            row.step = s.started_row.step  # and its step (a flow node's retry runs at a later one): the row as sealed
            row.attempt_call_ids = attempt_ids(s.started_row, s.call.id)
        self.audit.add(AuditWrite(row, started_pk=s.started_row.pk if s.started_row is not None else None))
        tool = s.tool
        outcome.trace.append(
            {
                "type": "tool.audit",
                "status": outcome.status.value,
                "latency_ms": latency_ms,
                "category": tool.category if tool is not None else ToolCategory.READ,
                "arguments": row.arguments_summary,
            }
        )
        return outcome
