"""Run state changes. Views, consumers and tasks call these; they hold no logic themselves."""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Case, F, Q, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from agents import attention, capacity, hooks
from agents.lease import heartbeat_for
from agents.models import ACTIVE_STATUSES, Agent, AgentKind, AgentVersion, Run, RunStatus, Session
from agents.store import event_rows, publish_after_commit, run_summary
from approvals.decisions import cancel_for_run, resume_run
from approvals.policy import FLOOR_OVERRIDE_ACTION, floor_for, loosening, recorded_overrides
from audit.masking import mask_text, mask_value
from audit.services import record_change
from core.batch import WriteBatch
from core.errors import Conflict, Refused, only_fields
from core.outages import dependency_down
from runtime.approval_policy import OVERRIDE_FLAG, flagged
from runtime.config import PolicyError, raw_input_patterns
from runtime.flows import input_problems
from runtime.types import Event, TerminalReason
from tenants.models import Tenant
from tenants.scoping import Actor
from tools.guardrails import InjectionRefused, screen_facts
from tools.models import Tool

log = logging.getLogger(__name__)

#: A run whose worker died this many times ends as ``error`` (``crash_loop``) instead of being retried.
MAX_CRASHES = 3


class RunRefused(Refused):
    """A request about a run that cannot be honoured; the message says why and what to do (400 naming ``field``,
    else 409)."""


def version_for_new_run(agent: Agent, session_id: Any = None) -> AgentVersion:
    """The gray release's pick for this session (sticky: a hash of tenant + session), else the current version."""
    try:
        released = hooks.version_for_session(agent, session_id) if session_id is not None else None
    except hooks.VersionRefused as exc:
        raise RunRefused(str(exc), field="agent") from None
    version = released or agent.current_version or agent.versions.order_by("-number").first()
    if version is None:
        raise RunRefused(f"The agent {agent.slug!r} has no version yet; an operator must create one.", field="agent")
    return version


@transaction.atomic
def start_run(*, actor: Actor, agent: Agent, text: str, session: Session | None = None,
              facts: dict[str, Any] | None = None, idempotency_key: str = "", request_digest: str = "",
              version: AgentVersion | None = None, playground: bool = False, enqueue: bool = True) -> Run:
    """Create the run and its session (if new) in this transaction; enqueue its task on commit (best effort).

    ``enqueue=False`` leaves that to the caller (``agents.acceptance.deliver``): a create that streams the run
    enqueues it once its stream has joined the run's feed, so no delta is published before the client listens.

    ``idempotency_key`` and ``request_digest`` are stored on the run (unique per tenant: a second run with the key
    raises ``IntegrityError``); ``agents.acceptance.accept_run`` sets them and answers retries.
    ``version`` runs that version instead of the release's pick (the console's playground; it must be one of
    ``agent``'s versions); ``playground`` labels the run as a playground run (counted apart in spend and metrics).
    """
    if version is not None and (version.agent_id != agent.pk or version.tenant_id != agent.tenant_id):
        raise RunRefused(f"Version {version.pk} is not a version of the agent {agent.slug!r}; pick one of its versions.",
                         field="version")
    try:  # the prompt-injection filter: block, or flag in facts
        facts = screen_facts(text, facts, settings=agent.tenant.settings, agent_slug=agent.slug)
    except InjectionRefused as exc:
        raise RunRefused(str(exc), field="input") from None
    if session is not None and session.agent_id != agent.pk:
        raise RunRefused(f"Session {session.pk} belongs to another agent; start a new session for {agent.slug!r}.",
                         field="session")
    if session is not None:
        # Locked: a concurrent start on this session, or its erasure (agents/erasure.py), waits for this transaction.
        session = Session.objects.select_for_update().get(pk=session.pk)
        if session.erased_at is not None:
            raise RunRefused(f"Session {session.pk} was erased; omit the field to start a new session.", field="session")
    if session is not None and Run.objects.filter(session=session, status__in=ACTIVE_STATUSES).exists():
        raise RunRefused("This session already has a run in progress; wait for it to finish or cancel it.", field="session")
    session_id = session.pk if session is not None else uuid.uuid4()
    version = version if version is not None else version_for_new_run(agent, session_id=session_id)
    if agent.kind == AgentKind.FLOW:
        check_flow_input(agent, version, text)
    # Personal data and secrets are masked before anything is stored or reaches the model (the events' rules);
    # a version may keep named patterns raw (an audited opt-in); cards and secrets are always masked.
    raw = raw_input_patterns(version.policy)
    text, facts = mask_text(text, keep=raw), mask_value(facts or {}, keep=raw)
    # The new session's row and the run's in one statement on PostgreSQL (core/batch.py): no insert SQL compiled
    # per request. A second run with the idempotency key raises IntegrityError here, as a create would.
    batch = WriteBatch()
    if session is None:
        session = Session(id=session_id, tenant_id=agent.tenant_id, agent=agent, created_by=actor.user,
                          api_key=actor.api_key)
        batch.insert(Session, [session])
    run = Run(
        tenant_id=agent.tenant_id, agent=agent, version=version, session=session,
        created_by=actor.user, api_key=actor.api_key, input=text, facts=facts or {},
        idempotency_key=idempotency_key, request_digest=request_digest, playground=playground,
    )
    batch.insert(Run, [run])
    batch.execute()
    if enqueue:
        enqueue_run(run.pk)
    return run


def check_flow_input(flow: Agent, version: AgentVersion, text: str) -> None:
    """A flow run's input (``text``, a JSON object) against its version's ``input_schema``, before anything is stored:
    the run is refused (400 naming ``input``) with every problem, each naming its field."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RunRefused("A flow's input is a JSON object (its keys are read as input.<key>).", field="input")
    problems = input_problems((version.definition or {}).get("input_schema"), value)
    if problems:
        raise RunRefused(f"The input does not match the flow {flow.slug!r} (version {version.number}): "
                         f"{'; '.join(problems)}.", field="input")


def enqueue_run(run_id: Any) -> None:
    """Enqueue the run's task when this transaction commits, best effort: the committed row is the outbox.

    A broker that is down is logged and counted, never raised into the caller (``agents.acceptance.deliver``);
    the run stays queued and the sweeper enqueues it later (``agents/sweeper.py``).
    """
    from agents.acceptance import deliver

    transaction.on_commit(lambda: deliver(run_id))


def finish_without_worker(run: Run, reason: TerminalReason, text: str) -> None:
    """End a run that no worker holds (queued, waiting, crash-looping), with its closing events. Call inside atomic()."""
    events = [
        Event("state.transition", {"from": run.phase, "to": "finished", "reason": text}),
        Event("run.finished", {"terminal_reason": reason.value, "output": None, "reason": text}),
    ]
    rows = event_rows(run, run.last_seq + 1, run.step, events)
    from agents.models import RunEvent

    RunEvent.objects.bulk_create(rows)
    now = timezone.now()
    changes = {
        "status": RunStatus.FINISHED, "terminal_reason": reason.value, "phase": "finished", "error": text,
        "finished_at": now, "last_seq": run.last_seq + len(rows), "lease_token": "", "lease_expires_at": None,
        "pending_calls": [],
    }
    Run.objects.filter(pk=run.pk).update(**changes)
    for field, value in changes.items():
        setattr(run, field, value)
    publish_after_commit(run, rows, run_summary(run))


@transaction.atomic
def cancel_run(*, actor: Actor, run: Run) -> Run:
    """Cancel now if no worker holds the run; otherwise at the worker's next step boundary."""
    locked = Run.objects.select_for_update().get(pk=run.pk)
    if locked.status == RunStatus.FINISHED:
        raise RunRefused(f"The run already finished ({locked.terminal_reason}); there is nothing to cancel.")
    who = actor.user.get_username() if actor.user is not None else "an API client"
    if locked.status in (RunStatus.QUEUED, RunStatus.WAITING) and not locked.lease_token:
        cancel_for_run(locked)
        finish_without_worker(locked, TerminalReason.CANCELLED, f"cancelled by {who}")
        child = (locked.facts or {}).get("awaiting_child")  # a waiting supervisor's sub-agent run ends with it
        awaited = (Run.objects.filter(pk=child, tenant_id=locked.tenant_id).exclude(status=RunStatus.FINISHED).first()
                   if child else None)  # the run's own tenant only, whatever its facts say
        if awaited is not None:
            cancel_run(actor=actor, run=awaited)
        if (locked.facts or {}).get("parent_run"):
            transaction.on_commit(lambda: resume_parent(locked))
    else:
        Run.objects.filter(pk=run.pk).update(cancel_requested=True)
        locked.cancel_requested = True
    return locked


def acquire_lease(run_id: str, token: str) -> Run | None:
    """Take the run for this worker, unless another holds a live lease or it is not runnable; then the run with its
    tenant, agent, version and session. A lease left behind by a worker that died counts as a crash."""
    now = timezone.now()
    taken = (Run.objects.filter(pk=run_id, status__in=(RunStatus.QUEUED, RunStatus.RUNNING))
             .filter(Q(lease_token="") | Q(lease_expires_at__lt=now))
             .update(lease_token=token, lease_expires_at=now + dt.timedelta(seconds=settings.RUN_LEASE_SECONDS),
                     status=RunStatus.RUNNING, started_at=Coalesce(F("started_at"), now),
                     crash_count=Case(When(~Q(lease_token=""), then=F("crash_count") + 1), default=F("crash_count"),
                                      output_field=Run._meta.get_field("crash_count"))))
    if not taken:
        return None
    return Run.objects.select_related("tenant", "agent", "version", "session").get(pk=run_id)


def release_lease(run_id: Any, token: str) -> None:
    Run.objects.filter(pk=run_id, lease_token=token).update(lease_token="", lease_expires_at=None)


def end_lease_now(run_id: Any, token: str) -> None:
    """The lease runs out now, its token kept: the sweeper's next pass re-enqueues the run and taking it again counts
    a crash (so a run that keeps failing this way ends as a crash loop). With the database still down nothing is
    written and the lease runs out on its own (RUN_LEASE_SECONDS)."""
    try:
        Run.objects.filter(pk=run_id, lease_token=token).update(lease_expires_at=timezone.now())
    except Exception as exc:
        if dependency_down(exc) is None:
            raise


def admit(run_id: str, token: str, *, parked: int = 0) -> Run | None:
    """:func:`acquire_lease` within the tenant's bound on running work (agents/capacity.py): None when the run is not
    runnable here, or when its tenant is at its bound and the run was parked (its task comes back by itself).
    ``parked``: how many times in a row it was parked already."""
    with transaction.atomic():
        now = timezone.now()
        found = Run.objects.filter(pk=run_id).values_list("tenant_id", "status", "lease_token", "lease_expires_at",
                                                          "agent__kind").first()
        if found is None:
            return None
        tenant_id, status, held, expires, kind = found
        runnable = status in (RunStatus.QUEUED, RunStatus.RUNNING) and (not held or (expires is not None and expires < now))
        if runnable and kind != AgentKind.FLOW:  # a flow run only plans: its nodes are admitted (flows/runner.py)
            # FOR NO KEY UPDATE, as everywhere (audit/chain.py): FOR UPDATE blocked the foreign-key checks of other
            # runs' step commits, and with a flow's lock on the tenant that was a deadlock (bench/faults.py)
            tenant = Tenant.objects.select_for_update(no_key=True).only("max_running").get(pk=tenant_id)
            now = timezone.now()  # after the lock: leases that lapsed while waiting for it no longer count
            if capacity.running_work(tenant_id, now, exclude=run_id) >= capacity.bound(tenant):
                _park(run_id, now, parked)
                return None
        return acquire_lease(run_id, token)


def _park(run_id: str, now: dt.datetime, parked: int) -> None:
    """The run waits for a place: its task comes back in TENANT_PARK_SECONDS, twice that after a second look, and so
    on up to TENANT_PARK_MAX_SECONDS: a tenant with many runs parked looks often enough (one of them every
    max / parked seconds) without its looks taking the worker slots the other tenants' runs need. Its row is marked now
    and then (every half of SWEEP_QUEUED_AFTER_SECONDS), so the sweeper sees it looked after and starts no second
    chain."""
    from agents.tasks import execute_run_task

    quiet = dt.timedelta(seconds=settings.SWEEP_QUEUED_AFTER_SECONDS / 2)
    Run.objects.filter(pk=run_id, updated_at__lt=now - quiet).update(updated_at=now)

    def requeue() -> None:
        try:
            wait = min(settings.TENANT_PARK_SECONDS * 2 ** min(parked, 16), settings.TENANT_PARK_MAX_SECONDS)
            execute_run_task.apply_async((str(run_id),), {"parked": parked + 1}, countdown=wait)
        except Exception:  # the broker is down: the run is still queued, the sweeper enqueues it again
            log.warning("run %s: parked but not re-enqueued; the sweeper takes it back", run_id, exc_info=True)

    transaction.on_commit(requeue)
    log.debug("run %s parked: its tenant is at its bound on running work", run_id)


def execute_run(run_id: str, *, in_place: bool = False, parked: int = 0) -> None:
    """Run (or resume) a run until it finishes, pauses or is cancelled. Safe to call twice.

    The tenant's bound on running work applies (:func:`admit`; ``parked``: how often it was parked so far), except
    ``in_place``: the caller runs it in a place it holds already (a flow's agent node runs its child run in the node's
    place)."""
    from agents.engine import build_loop

    token = uuid.uuid4().hex
    run = acquire_lease(run_id, token) if in_place else admit(run_id, token, parked=parked)
    if run is None:
        log.info("run %s is not runnable here (finished, waiting, leased by another worker, or parked)", run_id)
        return
    ended = interrupted = False
    try:
        if run.crash_count >= MAX_CRASHES:
            with transaction.atomic():
                attention.mark_abandoned(run, crash_loop=True)  # an operator checks what it did (agents/attention.py)
                finish_without_worker(run, TerminalReason.ERROR, f"crash_loop: the run's worker died {run.crash_count} times")
            return
        if run.agent.kind == AgentKind.FLOW:  # a flow run: the flows app's runner (agents/flow_hook.py)
            from agents.flow_hook import run_flow

            with heartbeat_for(run.pk, token):
                # ended in this call (an inline flow): its end gave the lease back, and a finished run is never waiting
                ended = run_flow(run, token)
            return
        from agents.supervisor import supervise, supervisor_of

        supervisor = supervisor_of(run)
        if supervisor is not None:  # routes to a sub-agent and runs it as a child run (agents/supervisor.py)
            with heartbeat_for(run.pk, token):
                supervise(run, supervisor)
            return
        loop = build_loop(run, token)
        with heartbeat_for(run.pk, token):  # a long model or tool call must not look like a dead worker
            loop.run(str(run.pk))
        # Its last step committed the end and gave the lease back (agents/store.py: the run's row in memory follows
        # every commit): nothing to release, and a finished run is never waiting.
        ended = run.status == RunStatus.FINISHED and not run.lease_token
    except Exception as exc:
        if dependency_down(exc) is not None:
            interrupted = True  # not the run's fault: a crash, resumed from its last committed step (issue #50)
            log.warning("run %s: interrupted by %s (%s); resumed by the sweeper from its last committed step", run_id,
                        dependency_down(exc), type(exc).__name__, exc_info=True)
            end_lease_now(run_id, token)
            return
        log.exception("run %s failed", run_id)
        with transaction.atomic():
            current = Run.objects.select_for_update().get(pk=run_id)
            if current.status != RunStatus.FINISHED and current.lease_token == token:
                attention.mark_abandoned(current, crash_loop=False)  # only if it left a write started
                why = (f"invalid policy: {'; '.join(exc.errors)}" if isinstance(exc, PolicyError)
                       else f"internal error: {type(exc).__name__}")
                finish_without_worker(current, TerminalReason.ERROR, why)
    finally:
        if not ended and not interrupted:
            release_lease(run_id, token)
    # A decision may have landed while this worker was still committing the pause: pick it up now. Only a waiting
    # run can be resumed, so a run that finished or is still queued costs one read here, not resume_run's four.
    if not ended and Run.objects.filter(pk=run_id, status=RunStatus.WAITING).exists():
        resume_run(run_id)
    if (run.facts or {}).get("parent_run"):  # a sub-agent's run that ended wakes the supervisor waiting for it
        resume_parent(Run.objects.only("status", "facts").get(pk=run_id))


def resume_waiting_run(run_id: Any) -> bool:
    """Re-enqueue a run waiting for approvals once they are all decided (``approvals.decisions.resume_run`` asks)."""
    with transaction.atomic():
        waiting = Run.objects.filter(pk=run_id, status=RunStatus.WAITING, lease_token="")
        found = waiting.values_list("facts", "tenant_id").first()
        if found is None:
            return False
        facts, tenant_id = found
        child = (facts or {}).get("awaiting_child")  # a supervisor waits for its sub-agent's run (agents/supervisor.py)
        if child and Run.objects.filter(pk=child, tenant_id=tenant_id).exclude(status=RunStatus.FINISHED).exists():
            return False
        if waiting.update(status=RunStatus.QUEUED):
            enqueue_run(run_id)
            return True
    return False


def resume_parent(run: Run) -> None:
    """A finished child run wakes the supervisor waiting for it (through the approvals check: none may be pending)."""
    parent = (run.facts or {}).get("parent_run")
    if parent and run.status == RunStatus.FINISHED:
        resume_run(parent)


# -- agents and versions (operators) ---------------------------------------------------------


class VersionLocked(Conflict):
    """A run used this version: it is history now and cannot change."""


#: The fields of a version an operator sets; everything else is derived.
VERSION_FIELDS = ("model", "system_prompt", "tools", "policy", "definition", "note")


@transaction.atomic
def create_agent(*, actor: Actor, tenant: Any, slug: str, name: str, description: str = "",
                 kind: str = AgentKind.AGENT) -> Agent:
    """An agent, or a flow (``kind="flow"``); agents and flows share one slug space per tenant (runs name them)."""
    actor.require("operate", tenant.pk)
    if kind not in AgentKind.values:
        raise RunRefused(f"kind must be one of {', '.join(AgentKind.values)}; got {kind!r}.", field="kind")
    existing = Agent.objects.for_tenant(tenant).filter(slug=slug).values_list("kind", flat=True).first()
    if existing is not None:
        raise RunRefused(f"The tenant already has {'a flow' if existing == AgentKind.FLOW else 'an agent'} {slug!r}; choose "
                         "another slug or add a version to it.", field="slug")
    agent = Agent.objects.create(tenant=tenant, slug=slug, name=name, description=description, kind=kind)
    record_change(tenant=tenant, actor=actor, action="flow.created" if kind == AgentKind.FLOW else "agent.created",
                  target=agent, details={"slug": slug, "kind": kind})
    return agent


#: What an operator may change on an agent (its slug is its name in URLs, sessions and plugin presets).
AGENT_FIELDS = ("name", "description", "current_version")


def update_agent(*, actor: Actor, agent: Agent, **fields: Any) -> Agent:
    """Rename or re-describe an agent, audited as ``agent.changed`` with the fields that changed; a new
    ``current_version`` goes through :func:`set_current_version` (the release gate) in the same transaction."""
    actor.require("operate", agent.tenant_id)
    only_fields("An agent's", fields, AGENT_FIELDS, RunRefused)
    with hooks.refusals_recorded(), transaction.atomic():
        return _update_agent(actor, agent, fields)


def _update_agent(actor: Actor, agent: Agent, fields: dict[str, Any]) -> Agent:
    changed = {name: value for name, value in fields.items() if getattr(agent, name) != value}
    current = changed.pop("current_version", _UNCHANGED)
    if current is not _UNCHANGED:
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        _make_current(actor, locked, current, reason="agent changed")
        agent.current_version, agent.updated_at = locked.current_version, locked.updated_at
    if not changed:
        return agent
    before = {name: getattr(agent, name) for name in changed}
    for name, value in changed.items():
        setattr(agent, name, value)
    agent.full_clean()
    agent.save(update_fields=[*changed, "updated_at"])
    record_change(tenant=agent.tenant, actor=actor, action="agent.changed", target=agent,
                  details={"fields": sorted(changed), "before": before})
    return agent


_UNCHANGED = object()


def set_current_version(*, actor: Actor, agent: Agent, version: AgentVersion | None, reason: str = "") -> Agent:
    """Make ``version`` the agent's current (stable) version: the one way there is (the API's ``make_current``, the
    admin's agent form, plugin presets, seed_demo). The release gate admits it first (``hooks.admit_current``: a
    refusal is a 409 whose audit row is kept); the change is audited as ``agent.current_set``."""
    actor.require("operate", agent.tenant_id)
    with hooks.refusals_recorded(), transaction.atomic():
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        _make_current(actor, locked, version, reason=reason)
    return locked


def check_current_version(*, actor: Actor, agent: Agent, version: AgentVersion | None) -> None:
    """The release gate's word alone, before a change (the admin's agent form): raises its refusal with the refusal's
    audit row written; when it allows, nothing is recorded (:func:`set_current_version` records that with the change)."""
    actor.require("operate", agent.tenant_id)
    if agent.current_version_id == (version.pk if version is not None else None):
        return
    with hooks.refusals_recorded():
        hooks.admit_current(agent, version, actor, audit=False)


def _make_current(actor: Actor, agent: Agent, version: AgentVersion | None, *, reason: str) -> None:
    """Under the agent's lock (``agent`` read with ``select_for_update``), in the caller's transaction."""
    if version is not None and version.agent_id != agent.pk:
        raise RunRefused(f"Version {version} is not a version of {agent.slug!r}; choose one of its own.", field="current_version")
    previous = agent.current_version
    if (previous.pk if previous is not None else None) == (version.pk if version is not None else None):
        return
    hooks.admit_current(agent, version, actor)
    agent.current_version = version
    agent.save(update_fields=["current_version", "updated_at"])
    record_change(tenant=agent.tenant, actor=actor, action="agent.current_set", target=agent,
                  details={"version": version.number if version is not None else None,
                           "version_id": version.pk if version is not None else None,
                           "previous": previous.number if previous is not None else None,
                           "previous_id": previous.pk if previous is not None else None, "reason": reason})


@transaction.atomic
def delete_agent(*, actor: Actor, agent: Agent) -> None:
    """Delete an agent that never ran (its runs are history and keep it); audited as ``agent.deleted``."""
    actor.require("operate", agent.tenant_id)
    if Run.objects.filter(agent=agent).exists():
        raise RunRefused(f"The agent {agent.slug!r} has runs and is kept with them; remove it from use instead.", field="agent")
    record_change(tenant=agent.tenant, actor=actor, action="agent.deleted", target=agent, details={"slug": agent.slug})
    agent.delete()


def create_version(*, actor: Actor, agent: Agent, make_current: bool = False, number: int | None = None, **fields: Any) -> AgentVersion:
    """The agent's next version (or ``number``), validated by ``AgentVersion.clean()`` and held to the tools'
    approval floors (raises ``ValidationError``); ``make_current`` goes through the release gate, which refuses a
    version no replay has passed (then nothing is created)."""
    actor.require("operate", agent.tenant_id)
    with hooks.refusals_recorded(), transaction.atomic():
        return _create_version(actor, agent, make_current, number, fields)


def _create_version(actor: Actor, agent: Agent, make_current: bool, number: int | None, fields: dict[str, Any]) -> AgentVersion:
    locked_agent = Agent.objects.select_for_update().get(pk=agent.pk)  # numbers are allocated one at a time
    last = AgentVersion.objects.filter(agent=locked_agent).order_by("-number").values_list("number", flat=True).first()
    version = AgentVersion(tenant_id=locked_agent.tenant_id, agent=locked_agent, number=number or (last or 0) + 1, created_by=actor.user,
                           **{k: v for k, v in fields.items() if k in VERSION_FIELDS})
    version.full_clean()
    floor_overrides = _hold_approval_floor(actor=actor, version=version, before=None)
    version.save()
    _record_floor_overrides(actor=actor, version=version, overrides=floor_overrides)
    if make_current:  # before the created row: that row (current: true) counts as "was stable" for the gate
        _make_current(actor, locked_agent, version, reason="created with make_current")
    record_change(tenant=locked_agent.tenant, actor=actor, action="agent_version.created", target=version,
                  details={"number": version.number, "model": version.model, "tools": version.tools, "current": make_current})
    _record_raw_input_choice(actor, version, before=())
    return version


def copy_version(*, actor: Actor, version: AgentVersion, note: str = "") -> AgentVersion:
    """A new, editable version copied from this one (a version a run used is immutable), made by :func:`create_version`."""
    actor.require("operate", version.tenant_id)
    fields = {name: getattr(version, name) for name in VERSION_FIELDS}
    fields.update(tools=list(version.tools), policy=dict(version.policy), note=note or f"copy of v{version.number}")
    return create_version(actor=actor, agent=version.agent, **fields)


@transaction.atomic
def update_version(*, actor: Actor, version: AgentVersion, **fields: Any) -> AgentVersion:
    """Change a version no run has used yet; a used one raises ``VersionLocked``."""
    actor.require("operate", version.tenant_id)
    current = AgentVersion.objects.select_for_update().select_related("agent").get(pk=version.pk)
    _refuse_if_locked(current)
    policy_before = current.policy
    changed = sorted(k for k, v in fields.items() if k in VERSION_FIELDS and getattr(current, k) != v)
    raw_before = raw_input_patterns(current.policy)
    for key in changed:
        setattr(current, key, fields[key])
    current.full_clean()
    floor_overrides = _hold_approval_floor(actor=actor, version=current, before=policy_before) if changed else []
    current.save()
    _record_floor_overrides(actor=actor, version=current, overrides=floor_overrides)
    record_change(tenant=current.agent.tenant, actor=actor, action="agent_version.updated", target=current,
                  details={"changed": changed})
    _record_raw_input_choice(actor, current, before=raw_before)
    return current


def _record_raw_input_choice(actor: Actor, version: AgentVersion, *, before: tuple[str, ...]) -> None:
    """A version that keeps personal data raw in its run input (``policy.input_masking.raw``) is its own audit row."""
    raw = raw_input_patterns(version.policy)
    if raw != before:
        record_change(tenant=version.agent.tenant, actor=actor, action="agent_version.raw_input", target=version,
                      details={"number": version.number, "raw": list(raw), "before": list(before)})


def delete_version(*, actor: Actor, version: AgentVersion) -> None:
    """Delete a version no run has used. Deleting the current one leaves the agent without one (its newest version
    then runs), which is a change of the current version like any other: through the release gate."""
    actor.require("operate", version.tenant_id)
    with hooks.refusals_recorded(), transaction.atomic():
        _delete_version(actor, version)


def _delete_version(actor: Actor, version: AgentVersion) -> None:
    current = AgentVersion.objects.select_for_update().select_related("agent").get(pk=version.pk)
    _refuse_if_locked(current)
    agent = Agent.objects.select_for_update().get(pk=current.agent_id)
    if agent.current_version_id == current.pk:
        _make_current(actor, agent, None, reason=f"v{current.number}, the current version, deleted")
    record_change(tenant=current.agent.tenant, actor=actor, action="agent_version.deleted", target=current,
                  details={"number": current.number})
    current.delete()


def _refuse_if_locked(version: AgentVersion) -> None:
    if version.is_locked:
        raise VersionLocked(
            f"Version {version.number} of {version.agent.slug!r} was used by a run, so it is read-only: "
            "create a new version with the change instead (POST to this agent's versions)."
        )


# -- approval floors: a version may make a tool's approval stricter, never looser (unless the owner says so) ---------


def owner_in_person(actor: Actor, tenant_id: Any) -> bool:
    """The tenant's owner, signed in with a session: an API key is not a person, whoever created it."""
    return actor.api_key is None and actor.user is not None and actor.roles.get(tenant_id) == "owner"


def approval_floor_errors(*, actor: Actor, version: AgentVersion, before: Any = None) -> list[str]:
    """Why this version's ``policy.approvals.tools`` may not be saved by ``actor`` (empty: it may)."""
    return _floor_check(actor=actor, version=version, before=before)[0]


def _hold_approval_floor(*, actor: Actor, version: AgentVersion, before: Any) -> list[dict[str, Any]]:
    errors, overrides = _floor_check(actor=actor, version=version, before=before)
    if errors:
        raise ValidationError({"policy": errors})
    return overrides


def _floor_check(*, actor: Actor, version: AgentVersion, before: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """Each entry is compared with its tool's floor (the tool's row and its plugin's declaration). A looser one needs
    the tenant's owner in person and ``"override_floor": true``; an unchanged one the owner already loosened stays."""
    entries = ((version.policy or {}).get("approvals") or {}).get("tools") or {}
    if not isinstance(entries, dict) or not entries:
        return [], []
    previous = (((before or {}).get("approvals") or {}).get("tools") or {}) if isinstance(before, dict) else {}
    tools = {t.name: t for t in Tool.objects.for_tenant(version.tenant_id).filter(name__in=list(entries))
             .select_related("plugin_install__plugin")}
    owner = owner_in_person(actor, version.tenant_id)
    recorded = recorded_overrides(tenant_id=version.tenant_id, version_id=version.pk) if previous else {}
    errors: list[str] = []
    overrides: list[dict[str, Any]] = []
    for name in sorted(entries):
        entry, tool = entries[name], tools.get(name)
        if tool is None or not isinstance(entry, dict):
            continue  # no such tool in the tenant (yet): a floor is applied at run time to whatever it becomes
        if previous.get(name) == entry and entry in recorded.get(name, []):
            continue  # unchanged, and the owner's override of it is on record
        path = f"policy.approvals.tools.{name}"
        problems = loosening(tool, entry, path=path)
        if flagged(entry) and not owner:
            errors.append(f"{path}.{OVERRIDE_FLAG}: only the tenant's owner, signed in (not with an API key), can override "
                          "a tool's approval floor; remove it")
        elif problems and not owner:
            errors += [f"{p}; only the tenant owner can loosen it (explicit override)" for p in problems]
        elif problems and not flagged(entry):
            errors += [f'{p}; to loosen it on purpose, add "{OVERRIDE_FLAG}": true to {path}' for p in problems]
        elif problems:
            overrides.append({"tool": name, "floor": floor_for(tool), "before": previous.get(name), "after": entry,
                              "loosened": [p.split(":", 1)[0] for p in problems]})
    return errors, overrides


def _record_floor_overrides(*, actor: Actor, version: AgentVersion, overrides: list[dict[str, Any]]) -> None:
    """One config-change row per loosened tool: the run-time gate honours an owner's override only with this row."""
    for details in overrides:
        record_change(tenant=version.agent.tenant, actor=actor, action=FLOOR_OVERRIDE_ACTION, target=version,
                      details={**details, "number": version.number})
