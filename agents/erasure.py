"""Erasing a session: what a data-subject request needs (issue #13, item 9).

``erase_session`` removes, in one transaction, everything of a session that holds what a person said
or was told, and keeps only counts, ids, times and statuses:

* each run of the session: ``input``, ``output``, ``error``, ``facts``, ``state`` and ``pending_calls``
  are blanked (the row stays: status, terminal reason, usage, times, so spend and run lists still add up);
* its ``RunMessage`` rows (what the model saw) are deleted, and ``message_count`` is 0;
* its ``RunEvent`` rows (the trace) are deleted, and ``last_seq`` is 0. Deleting them all keeps the trace's
  invariant (``seq`` is gapless from 1 to ``last_seq``): the API's event pages, the websocket backfill and
  the console's trace all read "no events" and agree. Redacting payloads in place would keep the
  waterfall's shape but every event type carries personal data somewhere (arguments, results, text);
* its ``Turn`` rows (the session's history, which later runs read) are deleted; ``Session.facts`` is blanked;
* its approval requests keep their decision record (tool, status, who decided, times, the arguments' hashes) but
  lose ``arguments``, ``edited_arguments`` and ``preview``; their decisions lose the approver's ``note`` (it may
  quote the call);
* a flow run's node rows keep kind, status, attempts and times but lose ``inputs``, ``output`` and ``error``;
* replay results of these runs keep their verdict (status, passed, what changed, tokens, cost) but lose the ``diff``
  (recorded and replayed answers, tool arguments, misses) and any error text; the evaluation sets keep the runs as
  members (reported as erased, never replayed again);
* a run's ``attention_resolution`` (an operator's note on it) is blanked too;
* ``ToolCallAudit`` rows are **kept**: they are append-only and HMAC-chained (rewriting one breaks
  ``verify_audit``), they are the legal record of what the agent did to the world, and they hold only masked,
  shortened argument summaries (cards, secrets, phone numbers, e-mail and ID numbers masked; free text such as
  a name may remain, at most 120 characters a value). The tombstone says how many were kept. The same holds
  for the configuration-change rows of the session's approval decisions (chained too: their notes and masked
  argument versions of an edited call stay there); the tombstone counts them as well.

``tests/db/test_erasure_everything.py`` checks this against every text and JSON column of every model: after an
erasure a marker from the conversation is found only in the two kept audit tables.

A run started by an agent tool of one of these runs (``facts.parent_run``) lives in a session of its own,
with an input derived from this conversation: those sessions are erased too, in the same transaction.

The session is marked (``erased_at``, ``erased_by``); no new run may join it (``start_run`` refuses). One
``ConfigChange`` row, ``session.erased``, is the tombstone: who (the user; for an API key, its owner and the
key's id and prefix), when, how (api, command, admin), the reason given, and the counts — never any of the
erased content. Erasing an erased session changes nothing and records nothing (the API answers 204 again).

A run that is still active (queued, running or waiting) would write again after the erasure: that is refused
(:class:`ErasureRefused`, a 409); cancel it first and wait until it has finished.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from agents.models import ACTIVE_STATUSES, Run, RunEvent, RunMessage, Session, Turn
from approvals.models import ApprovalDecision, ApprovalRequest
from audit.masking import mask_text
from audit.models import ConfigChange, ToolCallAudit
from audit.services import record_change
from core.errors import Conflict
from tenants.scoping import Actor

#: The tenant action erasing needs. ``own``, not ``operate``: erasure is irreversible and destroys the trace of what
#: runs did, which approvers and auditors rely on; operators start runs, and the person who acted should not be able
#: to remove the record of it. Answering a data-subject request is the data controller's decision, which here is the
#: tenant owner's (as consenting to a plugin's scopes is). An owner automates it with an API key of the owner role.
ERASE_ACTION = "own"
#: The tombstone's action name in the configuration-change audit.
TOMBSTONE_ACTION = "session.erased"
#: How deep agent tools may nest (tools.agent_exec.MAX_AGENT_DEPTH is 3); a bound on the search for child sessions.
_MAX_CHILD_DEPTH = 10


#: Tables of the layers above that copy run content (flows: node rows; releases: replay results), each erased by a
#: function those apps register at start-up (``register_eraser`` in their ``AppConfig.ready``): run ids -> rows changed.
#: ``agents`` imports nothing from them (see .importlinter).
_ERASERS: dict[str, Callable[[list[Any]], int]] = {}


def register_eraser(name: str, eraser: Callable[[list[Any]], int]) -> None:
    """Called once per app at start-up; ``name`` is the count's key in the tombstone."""
    if name in _ERASERS and _ERASERS[name] is not eraser:
        raise ValueError(f"an eraser named {name!r} is registered already")
    _ERASERS[name] = eraser


class ErasureRefused(Conflict):
    """The session cannot be erased now; the message says why and what to do (the API answers 409)."""


@dataclass(frozen=True)
class Erasure:
    """What ``erase_session`` did. ``already``: the session was erased before; nothing changed, nothing recorded."""

    counts: dict[str, int] = field(default_factory=dict)
    sessions: tuple[str, ...] = ()
    already: bool = False


def erase_session(*, actor: Actor, session: Session, reason: str = "", via: str = "api") -> Erasure:
    """Erase the stored inputs, messages and outputs of ``session`` (and of sessions its agent tools started).

    Raises ``PermissionDenied`` unless ``actor`` may ``own`` in the session's tenant, and :class:`ErasureRefused`
    while a run of these sessions is active. Idempotent.
    """
    if not actor.can(ERASE_ACTION, session.tenant_id):
        raise PermissionDenied("Only the tenant's owner may erase a session.")
    with transaction.atomic():
        root = Session.objects.select_for_update().get(pk=session.pk)
        if root.erased_at is not None:
            return Erasure(sessions=(str(root.pk),), already=True)
        ids = [root.pk, *_child_sessions(root)]
        # Lock every session (the root first, then by id), so no run can join one meanwhile (start_run locks it too).
        list(Session.objects.select_for_update().filter(pk__in=ids[1:]).order_by("pk").values_list("pk", flat=True))
        runs = list(Run.objects.select_for_update().filter(session_id__in=ids).order_by("pk").values("pk", "status"))
        active = [str(r["pk"]) for r in runs if r["status"] in ACTIVE_STATUSES]
        if active:
            raise ErasureRefused(
                f"{len(active)} run(s) of this session are still active ({', '.join(active[:5])}); cancel them "
                "(POST /api/v1/runs/<id>/cancel), wait until they have finished, then erase the session.")
        run_ids = [r["pk"] for r in runs]
        now = timezone.now()
        counts = {
            "sessions": len(ids),
            "runs": len(run_ids),
            "messages": RunMessage.objects.filter(run_id__in=run_ids).delete()[0],
            "events": RunEvent.objects.filter(run_id__in=run_ids).delete()[0],
            "turns": Turn.objects.filter(session_id__in=ids).delete()[0],
            "approvals": ApprovalRequest.objects.filter(run_id__in=run_ids).update(
                arguments={}, edited_arguments=None, preview={}),
            "approval_notes": ApprovalDecision.objects.filter(request__run_id__in=run_ids).exclude(note="").update(note=""),
        }
        for name, eraser in _ERASERS.items():  # the layers above: flow node rows, replay results
            counts[name] = eraser(run_ids)
        Run.objects.filter(pk__in=run_ids).update(
            input="", output="", error="", facts={}, state={}, pending_calls=[], last_seq=0, message_count=0,
            attention_resolution="", updated_at=now)
        Session.objects.filter(pk__in=ids).update(facts={}, erased_at=now, erased_by=actor.user, updated_at=now)
        kept = ToolCallAudit.objects.filter(run_id__in=run_ids).count()
        approval_ids = [str(pk) for pk in ApprovalRequest.objects.filter(run_id__in=run_ids).values_list("pk", flat=True)]
        kept_changes = ConfigChange.objects.filter(
            tenant_id=root.tenant_id, target_type=ApprovalRequest.__name__, target_id__in=approval_ids).count()
        key = actor.api_key
        record_change(tenant=root.tenant, actor=actor, action=TOMBSTONE_ACTION, target=root, details={
            "erased_at": now.isoformat(),
            "via": via,
            "api_key": {"id": key.pk, "prefix": key.prefix} if key is not None else None,
            "reason": mask_text(reason.strip())[:300],
            "sessions": [str(i) for i in ids],
            "counts": counts,
            "kept": {"tool_call_audits": kept, "approval_changes": kept_changes,
                     "why": "append-only and hash-chained; they hold masked argument summaries, not the conversation"},
        })
    return Erasure(counts=counts, sessions=tuple(str(i) for i in ids))


def _child_sessions(root: Session) -> list[Any]:
    """Sessions of runs that an agent tool of this session's runs started (their facts name ``parent_run``), transitively."""
    found: list[Any] = []
    seen = {root.pk}
    parents = [str(pk) for pk in Run.objects.filter(session=root).values_list("pk", flat=True)]
    for _ in range(_MAX_CHILD_DEPTH):
        if not parents:
            break
        children = list(
            Run.objects.filter(tenant_id=root.tenant_id, created_at__gte=root.created_at, facts__parent_run__in=parents)
            .exclude(session_id__in=seen).values_list("pk", "session_id"))
        new = {session_id for _, session_id in children} - seen
        found += sorted(new, key=str)
        seen |= new
        parents = [str(pk) for pk, _ in children]
    return found
