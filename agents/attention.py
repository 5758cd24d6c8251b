"""Runs that need an operator's attention (issue #13, item 5): something the run did must be checked by hand.

A run is marked (``Run.needs_attention``, with an entry appended to ``Run.attention_reasons``) when:

* ``outcome_unknown``: a non-idempotent write was cut off by a crash and not repeated (tools/gateway.py); it may or
  may not have taken effect. The model tells the user an operator will check; this is what makes an operator do so.
* ``write_timeout``: a write that had started (its intent was committed) gave no result within its timeout; the
  target may have applied it, and the call may even still be running.
* ``crash_loop``: the run's workers died ``services.MAX_CRASHES`` times and it ended as ``error``; the entry lists
  any write whose ``started`` row was never completed (its outcome is unknown too).
* ``unfinished_write``: a run that ended in an internal error left a write ``started`` and never completed.

The first two are found in the audit rows a step commits and marked by the run store in the same transaction as
the step (``reasons_for_writes``: no query of its own; the run row's one UPDATE carries the mark). The others are
marked where the run is ended without a worker (``mark_needs_attention``). Each mark is also a ``run.needs_attention``
trace event, so the live console shows it. A reason entry is ``{"kind", "tool", "call_id", "step", "audit_id", "at"}``
(crash-loop entries: ``{"kind", "crash_count", "step", "unfinished_writes", "at"}``).

An operator who checked resolves it (``resolve_attention``: the API's ``POST /api/v1/runs/<id>/resolve-attention``,
the admin action, the console's run page and ``manage.py resolve_attention`` all call it): ``needs_attention`` goes
back to false, who, when and the note are kept on the run, the reasons stay as history, and a configuration-change
audit row (``run.attention_resolved``) records the actor. A run marked again later needs a new resolution.

``agentops_runs_needing_attention`` (per tenant) is read from the database at scrape time (:class:`AttentionCollector`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from agents.models import Run, RunEvent
from audit.masking import mask_text
from audit.models import ToolCallAudit, ToolCallStatus
from audit.services import record_change
from core.errors import Refused
from runtime.types import Event
from tenants.scoping import Actor

#: The tenant action resolving needs: the operators who run the tenant's agents (owners too).
RESOLVE_ACTION = "operate"
#: The configuration-change audit row of a resolution.
RESOLVED_ACTION = "run.attention_resolved"
#: Trace events.
NEEDS_ATTENTION_EVENT = "run.needs_attention"
RESOLVED_EVENT = "run.attention_resolved"
#: The longest note kept (what the operator checked).
NOTE_MAX_CHARS = 2000
#: A write's final audit status -> the reason's kind, for writes that had started (their intent was committed).
UNKNOWN_WRITE_OUTCOMES = {"outcome_unknown": "outcome_unknown", "timeout": "write_timeout"}
#: At most this many reasons are kept on a run (the oldest are dropped): a runaway run cannot grow the row unbounded.
MAX_REASONS = 50

_MESSAGES = {
    "outcome_unknown": "A write was cut off by a crash and not repeated; it may or may not have taken effect. Check {tool} "
                       "(call {call_id}) at its target, then resolve.",
    "write_timeout": "A write gave no result within its timeout; it may have taken effect. Check {tool} (call {call_id}) "
                     "at its target, then resolve.",
    "unfinished_write": "The run ended while a write was under way; its outcome is unknown. Check {tool} (call {call_id}) "
                        "at its target, then resolve.",
    "crash_loop": "The run's workers died {crash_count} times and it was stopped. Check what it did before "
                  "(unfinished writes are listed), then resolve.",
}


class AttentionRefused(Refused):
    """The run cannot be resolved (it does not need attention, or the note is missing); the message says why.

    ``field`` names the request field at fault (a 400); without it the run's state is (a 409).
    """


def _iso(at: dt.datetime) -> str:
    return at.isoformat()


def open_reasons(run: Run) -> list[dict[str, Any]]:
    """The run's reasons since its last resolution (all of them if it was never resolved): what is still to check."""
    reasons = [r for r in (run.attention_reasons or []) if isinstance(r, dict)]
    resolved = run.attention_resolved_at
    if resolved is None:
        return reasons
    since = []
    for reason in reasons:
        try:
            at = dt.datetime.fromisoformat(str(reason.get("at")))
        except ValueError:
            continue
        if at.tzinfo is not None and at > resolved:
            since.append(reason)
    return since


def message_for(reason: dict[str, Any]) -> str:
    template = _MESSAGES.get(str(reason.get("kind")), "Check this run, then resolve.")
    try:
        return template.format(**{"tool": "?", "call_id": "?", "crash_count": "?", **reason})
    except (KeyError, IndexError, ValueError):
        return template


def reasons_for_writes(writes: Iterable[Any], *, at: dt.datetime) -> list[dict[str, Any]]:
    """The reasons a step's audit writes (tools.gateway.AuditWrite) give to mark its run. Pure: no query.

    Only writes that had started count: their intent row was committed before the side effect, so the call may have
    reached its target. A write refused before that (denied, invalid, rate limited, ...) never left.
    """
    reasons = []
    for write in writes:
        row = write.row
        kind = UNKNOWN_WRITE_OUTCOMES.get(str(row.status))
        if kind is None or write.started_pk is None:
            continue
        reasons.append({"kind": kind, "tool": row.tool_name, "call_id": row.call_id, "step": row.step,
                        "audit_id": write.started_pk, "at": _iso(at)})
    return reasons


def events_for(reasons: Iterable[dict[str, Any]], *, spans: dict[Any, str] | None = None) -> list[Event]:
    """One ``run.needs_attention`` trace event per reason, under its tool call's span when known."""
    spans = spans or {}
    return [Event(NEEDS_ATTENTION_EVENT, {**reason, "message": message_for(reason)}, parent_span_id=spans.get(reason.get("audit_id")))
            for reason in reasons]


def with_reasons(existing: Any, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``existing`` reasons (a JSON list) with ``new`` appended, keeping the newest ``MAX_REASONS``."""
    kept = [r for r in existing if isinstance(r, dict)] if isinstance(existing, list) else []
    return [*kept, *new][-MAX_REASONS:]


def _append_events(locked: Run, events: list[Event], changes: dict[str, Any]) -> Run:
    """Append ``events`` to a run's trace and apply ``changes`` with them (one UPDATE); the events are published on
    commit. ``locked`` was read ``select_for_update`` in the caller's transaction (its ``last_seq`` is current)."""
    from agents.store import event_rows, publish_after_commit, run_summary

    rows = event_rows(locked, locked.last_seq + 1, locked.step, events)
    RunEvent.objects.bulk_create(rows)
    changes = {**changes, "last_seq": locked.last_seq + len(rows), "updated_at": timezone.now()}
    Run.objects.filter(pk=locked.pk).update(**changes)
    for name, value in changes.items():
        setattr(locked, name, value)
    publish_after_commit(locked, rows, run_summary(locked))
    return locked


def unfinished_writes(run_id: Any) -> list[dict[str, Any]]:
    """Writes of the run whose ``started`` row was never completed: their outcome is unknown."""
    rows = ToolCallAudit.objects.filter(run_id=run_id, status=ToolCallStatus.STARTED).order_by("pk")
    return [{"tool": r.tool_name, "call_id": r.call_id, "step": r.step, "audit_id": r.pk, "span_id": r.span_id}
            for r in rows.only("pk", "tool_name", "call_id", "step", "span_id")[:MAX_REASONS]]


def mark_needs_attention(run: Run, reasons: list[dict[str, Any]], *, spans: dict[Any, str] | None = None) -> Run:
    """Mark a run outside a step commit (a run ended without a worker), with its trace events. Inside atomic()."""
    if not reasons:
        return run
    locked = Run.objects.select_for_update().get(pk=run.pk)
    _append_events(locked, events_for(reasons, spans=spans),
                   {"needs_attention": True, "attention_reasons": with_reasons(locked.attention_reasons, reasons)})
    for name in ("needs_attention", "attention_reasons", "last_seq", "updated_at"):
        setattr(run, name, getattr(locked, name))
    return run


def mark_abandoned(run: Run, *, crash_loop: bool) -> Run:
    """A run ended without a worker: a crash loop always needs a look; an internal error only if it left a write started.

    Call inside the transaction that ends the run (agents/services.py).
    """
    now = timezone.now()
    unfinished = unfinished_writes(run.pk)
    spans = {w["audit_id"]: w.pop("span_id") or None for w in unfinished}
    if crash_loop:
        reasons = [{"kind": "crash_loop", "crash_count": run.crash_count, "step": run.step, "unfinished_writes": unfinished,
                    "at": _iso(now)}]
    else:
        reasons = [{"kind": "unfinished_write", **w, "at": _iso(now)} for w in unfinished]
    return mark_needs_attention(run, reasons, spans=spans)


@transaction.atomic
def resolve_attention(*, actor: Actor, run: Run, note: str, via: str = "api") -> Run:
    """An operator checked what the run's reasons name: clear the mark, keep who/when/what, and audit it.

    Raises ``PermissionDenied`` unless ``actor`` may operate in the run's tenant, :class:`AttentionRefused` with
    ``field="note"`` without a note, and :class:`AttentionRefused` (no field) if the run does not need attention.
    """
    if not actor.can(RESOLVE_ACTION, run.tenant_id):
        raise PermissionDenied("Only an operator or owner of the run's tenant can resolve it.")
    note = mask_text(str(note or "").strip())[:NOTE_MAX_CHARS]
    if not note:
        raise AttentionRefused("Say what you checked (e.g. the refund was or was not made at the target).", field="note")
    locked = Run.objects.select_for_update().get(pk=run.pk)
    if not locked.needs_attention:
        when = f" (resolved {locked.attention_resolved_at:%Y-%m-%d %H:%M:%S} UTC)" if locked.attention_resolved_at else ""
        raise AttentionRefused(f"This run does not need attention{when}; there is nothing to resolve.")
    now = timezone.now()
    user = actor.user if getattr(actor.user, "is_authenticated", False) else None
    details: dict[str, Any] = {
        "note": note, "via": via, "run": str(locked.pk),
        "reasons": [{k: r.get(k) for k in ("kind", "tool", "call_id", "step", "audit_id", "unfinished_writes") if k in r}
                    for r in open_reasons(locked)],
    }
    if actor.api_key is not None:
        details["api_key"] = {"id": actor.api_key.pk, "prefix": actor.api_key.prefix}
    record_change(tenant=locked.tenant, actor=actor, action=RESOLVED_ACTION, target=locked, details=details)
    who = user.get_username() if user is not None else ("an API key" if actor.api_key is not None else via)
    return _append_events(locked, [Event(RESOLVED_EVENT, {"resolved_by": who, "via": via})], {
        "needs_attention": False, "attention_resolved_at": now, "attention_resolved_by": user, "attention_resolution": note,
    })


# -- the metric ----------------------------------------------------------------------------------


class AttentionCollector:
    """``agentops_runs_needing_attention`` per tenant, read at scrape time: one grouped COUNT per scrape.

    Registered with the other database gauges in ``console/metrics_view.py``. A tenant with none has no series.
    """

    def collect(self) -> Iterable[Any]:
        from django.db.models import Count
        from prometheus_client.core import GaugeMetricFamily

        gauge = GaugeMetricFamily("agentops_runs_needing_attention",
                                  "Runs an operator must check (e.g. a write whose outcome is unknown), by tenant.", labels=["tenant"])
        rows = Run.objects.filter(needs_attention=True).order_by().values("tenant__slug").annotate(count=Count("id"))
        for row in rows:
            gauge.add_metric([row["tenant__slug"]], row["count"])
        yield gauge
