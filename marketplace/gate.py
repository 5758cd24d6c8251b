"""The release gate (issue #16 item 5): a version gets release weight only after a passed replay on a named set.

An agent's ``ReleaseGate`` names an evaluation set (``releases``), a model mode and a minimum pass rate. Giving a
version other than the stable (current) one a weight above 0 needs the version's latest finished replay batch on
that set, in that mode, to have reached the pass rate. The gate owns its checks (``ReleaseGate.checks``): a batch counts
only if it ran at least them, the same or stricter (``marketplace/gate_checks.py``), so a replay with one check that
cannot fail passes nothing. Every decision, allowed or refused, writes an audit row (``release.gate_allowed`` /
``release.gate_refused``); a refusal's row is committed even though the change is not.

Making a version the agent's current (stable) one goes through the same gate, whichever way it comes (the API's
``make_current``, the admin's agent form, a plugin preset...: ``agents.services.set_current_version`` asks
:func:`admit_current` through ``agents.hooks``). A version that was the stable one before may become it again without
a fresh replay, so that an emergency rollback always works: that decision is audited with ``"rollback": true``.

The automatic rollback guard can use the same checks on live traffic (``GuardMetric.CHECKS``): the share of the
candidate's recent finished runs that fail the checks of its passing batch, judged by ``releases.diffs.run_checks``.
Checks that compare a run with its own recording (same tools, same answer...) have no recording to compare with on
live traffic and are not judged there; cost and steps are compared with the stable version's recent average.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q

from agents.models import Agent, AgentVersion, Run, RunStatus
from audit.models import ConfigChange
from audit.services import record_change
from marketplace import gate_checks
from marketplace.errors import MarketplaceError, acting_with_user, require
from marketplace.models import ReleaseGate
from releases import diffs
from releases.models import BatchStatus, EvaluationSet, ModelMode, ReplayBatch
from tenants.scoping import Actor

#: Checks a single live run can be judged by (the others compare a replay with its recording).
LIVE_CHECKS = ("answer_contains", "answer_not_contains", "cost_at_most", "steps_at_most")


class GateRefused(MarketplaceError):
    """A release weight, or a current version, the gate refuses (409): names the version, the set and what is needed.

    ``record_refusal`` (when set) writes the refusal's audit rows; the service whose transaction the refusal rolled back
    calls it afterwards (``agents.hooks.refusals_recorded``), so the rows outlive the change."""

    code = "release_gate"
    status = 409

    def __init__(self, message: str, *, field: str = "weights") -> None:
        super().__init__(message, field=field)
        self.record_refusal: Any = None


@dataclass(frozen=True)
class GateDecision:
    version: int | None
    weight: int | None  # None: the version is to become the current one
    allowed: bool
    reason: str
    batch: Any = None  # the id of the batch that counts, or None when no finished replay on the set ran the gate's checks
    pass_rate: float | None = None
    rollback: bool = False  # allowed without a fresh replay: the version was the stable one before

    def details(self, gate: ReleaseGate) -> dict[str, Any]:
        return {"version": self.version, "weight": self.weight, "change": "weight" if self.weight is not None else "current",
                "evaluation_set": gate.evaluation_set.name, "evaluation_set_id": gate.evaluation_set_id,
                "model_mode": gate.model_mode, "min_pass_rate": gate.min_pass_rate, "checks": gate.checks,
                "batch": self.batch, "pass_rate": self.pass_rate, "rollback": self.rollback, "allowed": self.allowed,
                "reason": self.reason}


def gate_of(agent: Agent) -> ReleaseGate | None:
    return ReleaseGate.objects.filter(agent_id=agent.pk, enabled=True).select_related("evaluation_set").first()


def latest_batches(gate: ReleaseGate, version: AgentVersion | int) -> tuple[ReplayBatch | None, ReplayBatch | None]:
    """(the batch that counts: the version's latest finished replay on the gate's set, in the gate's model mode, that ran
    at least the gate's checks; the latest such replay whatever its checks). Only the latest ``BATCHES_LOOKED_AT`` are
    looked at: one that counts behind more batches than that does not count (the gate refuses, never allows, by it)."""
    version_id = version.pk if isinstance(version, AgentVersion) else version
    recent = list(ReplayBatch.objects.filter(tenant_id=gate.tenant_id, evaluation_set_id=gate.evaluation_set_id,
                                             candidate_id=version_id, model_mode=gate.model_mode, status=BatchStatus.FINISHED)
                  .order_by("-finished_at", "-created_at")[: gate_checks.BATCHES_LOOKED_AT])
    edited = last_edited(gate.tenant_id, version_id)
    counting = next((b for b in recent if not gate_checks.missing(gate.checks, b.checks)
                     and (edited is None or b.created_at > edited)), None)
    return counting, (recent[0] if recent else None)


def last_edited(tenant_id: Any, version_id: Any) -> Any:
    """When the version's contents last changed (``agent_version.updated`` rows that changed a field), or None: a replay
    started before that replayed something else, and does not count."""
    rows = ConfigChange.objects.filter(tenant_id=tenant_id, action="agent_version.updated", target_type="AgentVersion",
                                       target_id=str(version_id)).order_by("-created_at").values_list("created_at", "details")
    return next((at for at, details in rows if (details or {}).get("changed") != []), None)


def latest_batch(gate: ReleaseGate, version: AgentVersion | int) -> ReplayBatch | None:
    """The batch that counts for the gate (see :func:`latest_batches`), or None."""
    return latest_batches(gate, version)[0]


def _judge(agent: Agent, gate: ReleaseGate, version: AgentVersion, weight: int | None) -> GateDecision:
    """The gate's decision on ``version`` getting ``weight`` (None: becoming the current version), by its batches."""
    number = version.number
    change = f"get weight {weight}" if weight is not None else "become its current (stable) version"
    counting, latest = latest_batches(gate, version)
    need = (f"a finished replay of v{number} on evaluation set {gate.evaluation_set.name!r} in {gate.model_mode} mode, "
            f"running at least the gate's checks {json.dumps(gate.checks)} (or stricter), with a pass rate of at least "
            f"{gate.min_pass_rate:g}")
    if counting is None and latest is None:
        return GateDecision(number, weight, False,
                            f"v{number} of {agent.slug!r} cannot {change}: the release gate needs {need}, and v{number} has "
                            "none yet; start one (POST /api/v1/replays with those checks) and wait for it to finish.")
    if counting is None:
        assert latest is not None
        lacking = gate_checks.missing(gate.checks, latest.checks)
        why = (f"did not run {json.dumps(lacking)}" if lacking else
               f"was started before v{number} was last edited, so it replayed other contents")
        return GateDecision(number, weight, False,
                            f"v{number} of {agent.slug!r} cannot {change}: the release gate needs {need}; its latest (replay "
                            f"batch {latest.pk}) {why}, so it does not count, and no earlier one does. Replay it with at "
                            "least the gate's checks.", None, latest.pass_rate)
    if counting.pass_rate is None or counting.pass_rate < gate.min_pass_rate:
        got = "no judged runs" if counting.pass_rate is None else f"pass rate {counting.pass_rate:g}"
        return GateDecision(number, weight, False,
                            f"v{number} of {agent.slug!r} cannot {change}: the release gate needs {need}; its latest (replay "
                            f"batch {counting.pk}) had {got}. Fix the version, or replay it again once fixed.",
                            counting.pk, counting.pass_rate)
    return GateDecision(number, weight, True,
                        f"v{number} passed: replay batch {counting.pk} had pass rate {counting.pass_rate:g} "
                        f"(at least {gate.min_pass_rate:g} needed) running the gate's checks", counting.pk, counting.pass_rate)


def decide(agent: Agent, weights: dict[int, int], versions: dict[int, AgentVersion]) -> tuple[ReleaseGate | None, list[GateDecision]]:
    """The gate's decision for each version given a weight above 0 that is not the stable one (reads only)."""
    gate = gate_of(agent)
    if gate is None:
        return None, []
    decisions = []
    for number, weight in sorted(weights.items()):
        version = versions.get(number)
        if weight <= 0 or version is None or version.pk == agent.current_version_id:
            continue
        decisions.append(_judge(agent, gate, version, weight))
    return gate, decisions


def record(agent: Agent, gate: ReleaseGate, decisions: list[GateDecision], actor: Actor) -> None:
    for decision in decisions:
        record_change(tenant=agent.tenant, actor=actor, action="release.gate_allowed" if decision.allowed else "release.gate_refused",
                      target=agent, details=decision.details(gate))


def check(agent: Agent, weights: dict[int, int], versions: dict[int, AgentVersion], actor: Actor) -> list[GateDecision]:
    """Raise ``GateRefused`` (its audit rows committed first, in their own transaction) if the gate refuses any weight;
    else return the decisions, for the caller to audit with the change it makes."""
    gate, decisions = decide(agent, weights, versions)
    refused = [d for d in decisions if not d.allowed]
    if gate is not None and refused:
        with transaction.atomic():
            record(agent, gate, decisions, actor)
        raise GateRefused(" ".join(d.reason for d in refused))
    return decisions


# -- the current (stable) version: every way of setting it comes here (agents.hooks.admit_current) -------------------


def was_stable(agent: Agent, version: AgentVersion) -> bool:
    """Whether ``version`` was the agent's current (stable) version before, by the audit trail (append-only, chained):
    made current or replaced as the current one (``agent.current_set``), and before that row existed, created with
    ``make_current`` (``agent_version.created``) or replaced in the admin (``agent.changed``, whose ``before`` named it)."""
    return ConfigChange.objects.filter(tenant_id=agent.tenant_id).filter(
        Q(action="agent.current_set", target_type="Agent", target_id=str(agent.pk), details__version_id=version.pk)
        | Q(action="agent.current_set", target_type="Agent", target_id=str(agent.pk), details__previous_id=version.pk)
        | Q(action="agent.changed", target_type="Agent", target_id=str(agent.pk), details__before__current_version=version.pk)
        | Q(action="agent_version.created", target_type="AgentVersion", target_id=str(version.pk), details__current=True)
    ).exists()


def admit_current(agent: Agent, version: AgentVersion | None, actor: Actor | None, *, audit: bool = True) -> GateDecision | None:
    """The release gate on making ``version`` the agent's current (stable) version (``None``: leaving it without one).

    Called under the agent's lock, in the change's transaction. No gate, or a disabled one: allowed, nothing recorded
    here (the change's own row says it). Otherwise allowed when the version passed as for a weight, or when it was the
    stable version before (a rollback, allowed without a fresh replay so that it works in an emergency: audited with
    ``"rollback": true``); the allowed row (``release.gate_allowed``) is written when ``audit``. Refused: raises
    ``GateRefused`` (409) whose ``record_refusal`` writes ``release.gate_refused`` once the transaction rolled back.
    """
    gate = gate_of(agent)
    if gate is None:
        return None
    who = acting_with_user(actor)[0]
    if version is None:
        decision = GateDecision(None, None, False,
                                f"{agent.slug!r} has a release gate, so it keeps a current (stable) version: without one its "
                                "new runs would use its newest version, replayed or not. Make another version current instead.")
    elif was_stable(agent, version):
        counting = latest_batch(gate, version)
        decision = GateDecision(version.number, None, True,
                                f"v{version.number} was the stable version of {agent.slug!r} before: a rollback, allowed "
                                "without a fresh replay", counting.pk if counting else None,
                                counting.pass_rate if counting else None, rollback=True)
    else:
        decision = _judge(agent, gate, version, None)
    if not decision.allowed:
        then = "" if version is None else (f" Once it passed, make it current (PATCH /api/v1/agents/{agent.slug}/versions/"
                                           f"{version.number} with {{\"make_current\": true}}, or the agent's page in the admin).")
        refused = GateRefused(decision.reason + then, field="current_version")

        def record_refusal() -> None:
            with transaction.atomic():
                record(agent, gate, [decision], who)

        refused.record_refusal = record_refusal
        raise refused
    if audit:
        record(agent, gate, [decision], who)
    return decision


class InvalidChecks(MarketplaceError):
    """A gate's checks with problems, each listed under ``checks`` (``checks[1].text: ...``)."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("The gate's checks are not valid: " + "; ".join(errors), field="checks")
        self.errors = errors

    def details(self) -> list[str]:
        return self.errors


def _pass_rate(value: Any) -> float:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = -1.0
    if isinstance(value, bool) or not 0 <= rate <= 1:
        raise MarketplaceError(f"min_pass_rate must be a fraction from 0 to 1 (0.95 = 95 %); got {value!r}.", field="min_pass_rate")
    return rate


@transaction.atomic
def set_release_gate(*, agent: Agent, evaluation_set: EvaluationSet | None, actor: Actor | None, min_pass_rate: Any = 1.0,
                     model_mode: str = ModelMode.RECORDED, enabled: bool = True, checks: Any = None) -> ReleaseGate | None:
    """Set (or, with ``evaluation_set=None``, remove) the agent's release gate. ``checks``: the checks a replay must
    have run to count (``marketplace/gate_checks.py``); ``None`` keeps the gate's, or gives a new gate the default ones."""
    who, user = acting_with_user(actor)
    require(who, "operate", agent.tenant_id, "change release gates")
    previous = ReleaseGate.objects.filter(agent=agent).select_related("evaluation_set").first()
    before = _snapshot(previous)
    if evaluation_set is None:
        if previous is None:
            return None
        previous.delete()
        record_change(tenant=agent.tenant, actor=who, action="release.gate_removed", target=agent, details={"previous": before})
        return None
    if evaluation_set.tenant_id != agent.tenant_id or evaluation_set.agent_id != agent.pk:
        raise MarketplaceError(f"evaluation_set must be a set of {agent.slug!r}'s runs in this tenant; "
                               f"{evaluation_set.name!r} is not.", field="evaluation_set")
    if model_mode not in ModelMode.values:
        raise MarketplaceError(f"model_mode must be one of {', '.join(ModelMode.values)}; got {model_mode!r}.", field="model_mode")
    rate = _pass_rate(min_pass_rate)
    if checks is None:
        checks = previous.checks if previous is not None else gate_checks.default_checks()
    stored, problems = gate_checks.check_problems(checks)
    if problems:
        raise InvalidChecks(problems)
    gate, _created = ReleaseGate.objects.update_or_create(
        agent=agent, defaults={"tenant_id": agent.tenant_id, "evaluation_set": evaluation_set, "min_pass_rate": rate,
                               "model_mode": model_mode, "checks": stored, "enabled": bool(enabled), "updated_by": user})
    record_change(tenant=agent.tenant, actor=who, action="release.gate_set", target=agent,
                  details={"gate": _snapshot(gate), "previous": before})
    return gate


def _snapshot(gate: ReleaseGate | None) -> dict[str, Any] | None:
    if gate is None:
        return None
    return {"evaluation_set": gate.evaluation_set.name, "evaluation_set_id": gate.evaluation_set_id,
            "min_pass_rate": gate.min_pass_rate, "model_mode": gate.model_mode, "checks": gate.checks, "enabled": gate.enabled}


def describe(agent: Agent) -> dict[str, Any] | None:
    """The gate as the release endpoint shows it (None: no gate)."""
    gate = ReleaseGate.objects.filter(agent_id=agent.pk).select_related("evaluation_set").first()
    if gate is None:
        return None
    return {"evaluation_set": gate.evaluation_set_id, "evaluation_set_name": gate.evaluation_set.name,
            "min_pass_rate": gate.min_pass_rate, "model_mode": gate.model_mode, "checks": gate.checks, "enabled": gate.enabled,
            "updated_at": gate.updated_at}


# -- the same checks on live traffic (the release guard's "checks" metric) ------------------------------------------


def _cost(usage: Any) -> float:
    try:
        return float((usage or {}).get("cost") or 0)
    except (TypeError, ValueError):
        return 0.0


def live_check_failure_rate(agent: Agent, version: AgentVersion, runs: list[tuple[str, Any, str, int]],
                            window: int) -> tuple[float | None, list[str]]:
    """The share of ``runs`` ((terminal_reason, usage, output, steps) of the candidate's finished runs) failing the
    checks of the candidate's batch that counts for the gate (which ran at least the gate's checks, maybe stricter ones);
    ``(None, [])`` when there is nothing to judge
    by (no gate, no batch, or only checks a live run cannot be judged by). Also returns the checks judged."""
    gate = gate_of(agent)
    batch = latest_batch(gate, version) if gate is not None else None
    checks = [c for c in (batch.checks if batch is not None else []) or [] if c.get("check") in LIVE_CHECKS]
    if not checks or not runs:
        return None, []
    stable = (list(Run.objects.filter(agent=agent, version_id=agent.current_version_id, status=RunStatus.FINISHED)
                   .order_by("-finished_at", "-created_at").values_list("usage", "step")[:window])
              if agent.current_version_id else [])
    base_cost = sum(_cost(u) for u, _ in stable) / len(stable) if stable else 0.0
    base_steps = sum(s for _, s in stable) / len(stable) if stable else 0.0
    failed = 0
    for _reason, usage, output, steps in runs:
        pair = {"answer": {"replayed": output or ""}, "cost": {"recorded": base_cost, "replayed": _cost(usage)},
                "steps": {"recorded": base_steps, "replayed": steps}}
        if not all(r["passed"] for r in diffs.run_checks(checks, pair)):
            failed += 1
    return failed / len(runs), [c["check"] for c in checks]
