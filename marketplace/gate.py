"""The release gate (issue #16 item 5): a version gets release weight only after a passed replay on a named set.

An agent's ``ReleaseGate`` names an evaluation set (``releases``), a model mode and a minimum pass rate. Giving a
version other than the stable (current) one a weight above 0 needs the version's latest finished replay batch on
that set, in that mode, to have reached the pass rate. Every decision, allowed or refused, writes an audit row
(``release.gate_allowed`` / ``release.gate_refused``); a refusal's row is committed even though the change is not.

The automatic rollback guard can use the same checks on live traffic (``GuardMetric.CHECKS``): the share of the
candidate's recent finished runs that fail the checks of its passing batch, judged by ``releases.diffs.run_checks``.
Checks that compare a run with its own recording (same tools, same answer...) have no recording to compare with on
live traffic and are not judged there; cost and steps are compared with the stable version's recent average.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from agents.models import Agent, AgentVersion, Run, RunStatus
from audit.services import record_change
from marketplace.errors import MarketplaceError, acting_with_user, require
from marketplace.models import ReleaseGate
from releases import diffs
from releases.models import BatchStatus, EvaluationSet, ModelMode, ReplayBatch
from tenants.scoping import Actor

#: Checks a single live run can be judged by (the others compare a replay with its recording).
LIVE_CHECKS = ("answer_contains", "answer_not_contains", "cost_at_most", "steps_at_most")


class GateRefused(MarketplaceError):
    """A release weight the gate refuses (409): names the version, the set and what is needed."""

    code = "release_gate"
    status = 409

    def __init__(self, message: str) -> None:
        super().__init__(message, field="weights")


@dataclass(frozen=True)
class GateDecision:
    version: int
    weight: int
    allowed: bool
    reason: str
    batch: Any = None  # the batch's id, or None when the version has no finished replay on the set
    pass_rate: float | None = None

    def details(self, gate: ReleaseGate) -> dict[str, Any]:
        return {"version": self.version, "weight": self.weight, "evaluation_set": gate.evaluation_set.name,
                "evaluation_set_id": gate.evaluation_set_id, "model_mode": gate.model_mode,
                "min_pass_rate": gate.min_pass_rate, "batch": self.batch, "pass_rate": self.pass_rate,
                "allowed": self.allowed, "reason": self.reason}


def gate_of(agent: Agent) -> ReleaseGate | None:
    return ReleaseGate.objects.filter(agent_id=agent.pk, enabled=True).select_related("evaluation_set").first()


def latest_batch(gate: ReleaseGate, version: AgentVersion | int) -> ReplayBatch | None:
    """The version's latest finished replay on the gate's set, in the gate's model mode."""
    version_id = version.pk if isinstance(version, AgentVersion) else version
    return (ReplayBatch.objects.filter(tenant_id=gate.tenant_id, evaluation_set_id=gate.evaluation_set_id,
                                       candidate_id=version_id, model_mode=gate.model_mode, status=BatchStatus.FINISHED)
            .order_by("-finished_at", "-created_at").first())


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
        batch = latest_batch(gate, version)
        need = (f"a finished replay of v{number} on evaluation set {gate.evaluation_set.name!r} in {gate.model_mode} mode "
                f"with a pass rate of at least {gate.min_pass_rate:g}")
        if batch is None:
            decisions.append(GateDecision(number, weight, False,
                                          f"v{number} of {agent.slug!r} cannot get weight {weight}: the release gate needs {need}, "
                                          f"and v{number} has none yet; start one (POST /api/v1/replays) and wait for it to finish."))
        elif batch.pass_rate is None or batch.pass_rate < gate.min_pass_rate:
            got = "no judged runs" if batch.pass_rate is None else f"pass rate {batch.pass_rate:g}"
            decisions.append(GateDecision(number, weight, False,
                                          f"v{number} of {agent.slug!r} cannot get weight {weight}: the release gate needs {need}; "
                                          f"its latest (replay batch {batch.pk}) had {got}. Fix the version, or replay it "
                                          "again once fixed.", batch.pk, batch.pass_rate))
        else:
            decisions.append(GateDecision(number, weight, True,
                                          f"v{number} passed: replay batch {batch.pk} had pass rate {batch.pass_rate:g} "
                                          f"(at least {gate.min_pass_rate:g} needed)", batch.pk, batch.pass_rate))
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
                     model_mode: str = ModelMode.RECORDED, enabled: bool = True) -> ReleaseGate | None:
    """Set (or, with ``evaluation_set=None``, remove) the agent's release gate."""
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
    gate, _created = ReleaseGate.objects.update_or_create(
        agent=agent, defaults={"tenant_id": agent.tenant_id, "evaluation_set": evaluation_set, "min_pass_rate": rate,
                               "model_mode": model_mode, "enabled": bool(enabled), "updated_by": user})
    record_change(tenant=agent.tenant, actor=who, action="release.gate_set", target=agent,
                  details={"gate": _snapshot(gate), "previous": before})
    return gate


def _snapshot(gate: ReleaseGate | None) -> dict[str, Any] | None:
    if gate is None:
        return None
    return {"evaluation_set": gate.evaluation_set.name, "evaluation_set_id": gate.evaluation_set_id,
            "min_pass_rate": gate.min_pass_rate, "model_mode": gate.model_mode, "enabled": gate.enabled}


def describe(agent: Agent) -> dict[str, Any] | None:
    """The gate as the release endpoint shows it (None: no gate)."""
    gate = ReleaseGate.objects.filter(agent_id=agent.pk).select_related("evaluation_set").first()
    if gate is None:
        return None
    return {"evaluation_set": gate.evaluation_set_id, "evaluation_set_name": gate.evaluation_set.name,
            "min_pass_rate": gate.min_pass_rate, "model_mode": gate.model_mode, "enabled": gate.enabled,
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
    checks of the candidate's latest finished replay on the gate's set; ``(None, [])`` when there is nothing to judge
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
