"""Gradual release: per-version weights, rollback, the guards that roll back on their own, and tool rollouts.

Keyword arguments, an explicit actor (``None``: the platform, e.g. the periodic guard check), one atomic
transaction, the audit row written in it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from agents.models import Agent, AgentVersion, Run, RunStatus
from audit.services import record_change
from core.numbers import whole_number
from marketplace import gate
from marketplace.errors import (
    InvalidWeights,
    MarketplaceError,
    acting_with_user,
    require,
)
from marketplace.models import (
    GuardMetric,
    ReleaseGuard,
    ReleaseWeight,
    ToolRollout,
)
from marketplace.release import weight_errors
from tenants.scoping import Actor
from tools.models import Tool

log = logging.getLogger(__name__)

#: Terminal reasons that count as errors for the release guard.
ERROR_REASONS = ("error", "timeout")


def _version_number(agent: Agent, key: Any) -> int:
    if isinstance(key, AgentVersion):
        if key.agent_id != agent.pk:
            raise InvalidWeights([f"{key} is not a version of agent {agent.slug!r}."])
        return key.number
    text = str(key).lower().removeprefix("v")
    number = whole_number(text, digits=9)
    if number is None:
        raise InvalidWeights([f"Name versions by number (1 or v1); got {key!r}."])
    return number


def _snapshot(agent: Agent) -> dict[str, int]:
    return {f"v{n}": w for n, w in ReleaseWeight.objects.filter(agent=agent).values_list("version__number", "weight")}


def set_release_weights(*, agent: Agent, weights: Mapping[Any, int], actor: Actor | None) -> list[ReleaseWeight]:
    """Replace an agent's release weights (keys: version numbers, "v2", or AgentVersion rows; values sum to 100).

    Takes effect for the next run: sessions are assigned by a stable hash, so a session keeps its
    version unless the weights move it. An empty mapping ends the release (runs use the current version).
    With a release gate (``marketplace/gate.py``) a version other than the stable one gets a weight above 0 only
    after a passed replay; each gate decision is audited, a refusal's row committed although the change is not.
    """
    who, user = acting_with_user(actor)
    require(who, "operate", agent.tenant_id, "change release weights")
    by_number, versions = _checked_weights(agent, weights)
    decisions = gate.check(agent, by_number, versions, who)
    return _apply_weights(agent=agent, weights=weights, who=who, user=user, decisions=decisions)


def check_release_gate(*, agent: Agent, weights: Mapping[Any, int], actor: Actor | None) -> None:
    """The gate alone, before a change (the admin's form): raise ``GateRefused`` with its audit rows committed;
    nothing is recorded when the gate allows (``set_release_weights`` records that with the change)."""
    who, _user = acting_with_user(actor)
    require(who, "operate", agent.tenant_id, "change release weights")
    by_number, versions = _checked_weights(agent, weights)
    gate.check(agent, by_number, versions, who)


def _checked_weights(agent: Agent, weights: Mapping[Any, int]) -> tuple[dict[int, int], dict[int, AgentVersion]]:
    by_number = {_version_number(agent, k): w for k, w in weights.items()}
    versions = {v.number: v for v in agent.versions.all()}
    errors = weight_errors(by_number, known_numbers=list(versions), agent_slug=agent.slug)
    if by_number and Agent.objects.filter(pk=agent.pk, current_version__isnull=True).exists() and not errors:
        errors.append(f"Agent {agent.slug!r} has no current (stable) version; set one before a gray release.")
    if errors:
        raise InvalidWeights(errors)
    return by_number, versions


@transaction.atomic
def _apply_weights(*, agent: Agent, weights: Mapping[Any, int], who: Actor, user: Any,
                   decisions: list[gate.GateDecision]) -> list[ReleaseWeight]:
    agent = Agent.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=agent.pk)
    by_number, versions = _checked_weights(agent, weights)  # again, under the agent's lock
    if decisions:
        rule = gate.gate_of(agent)
        if rule is not None:
            gate.record(agent, rule, decisions, who)
    previous = _snapshot(agent)
    existing = {r.version_id: r for r in ReleaseWeight.objects.filter(agent=agent)}
    now = timezone.now()
    kept = []
    for number, weight in sorted(by_number.items()):
        version = versions[number]
        row = existing.pop(version.pk, None)
        if row is None:
            row = ReleaseWeight(tenant_id=agent.tenant_id, agent=agent, version=version, weight=0)
        if weight > 0 and row.weight == 0:
            row.live_since = now
        row.weight, row.updated_by = weight, user
        row.save()
        kept.append(row)
    ReleaseWeight.objects.filter(pk__in=[r.pk for r in existing.values()]).delete()
    record_change(tenant=agent.tenant, actor=who, action="release.weights_set", target=agent,
                  details={"weights": _snapshot(agent), "previous": previous})
    return kept


@transaction.atomic
def rollback_version(*, agent: Agent, version: AgentVersion, actor: Actor | None, reason: str = "",
                     details: dict[str, Any] | None = None) -> ReleaseWeight | None:
    """Instant rollback: the version's weight goes to 0 and its share to the stable (current) version.

    Takes effect on the next run. Returns the stable version's row, or None if the version had no share.
    """
    who, user = acting_with_user(actor)
    require(who, "operate", agent.tenant_id, "roll back releases")
    agent = Agent.objects.select_for_update(of=("self",)).select_related("tenant", "current_version").get(pk=agent.pk)
    if version.agent_id != agent.pk:
        raise MarketplaceError(f"{version} is not a version of agent {agent.slug!r}.", field="version")
    stable = agent.current_version
    if stable is None or stable.pk == version.pk:
        raise MarketplaceError(f"v{version.number} is the stable version of {agent.slug!r}, so there is nothing to roll back "
                               "to; make another version current first.", field="version")
    row = ReleaseWeight.objects.filter(agent=agent, version=version).first()
    if row is None or row.weight == 0:
        return None
    previous = _snapshot(agent)
    moved = row.weight
    row.weight, row.updated_by = 0, user
    row.save()
    stable_row, _ = ReleaseWeight.objects.get_or_create(agent=agent, version=stable,
                                                        defaults={"tenant_id": agent.tenant_id, "weight": 0})
    if stable_row.weight == 0:
        stable_row.live_since = timezone.now()
    stable_row.weight += moved
    stable_row.updated_by = user
    stable_row.save()
    record_change(tenant=agent.tenant, actor=who, action="release.rolled_back", target=agent,
                  details={"version": version.number, "to": stable.number, "moved": moved, "reason": reason or "manual",
                           "automatic": actor is None, "previous": previous, "weights": _snapshot(agent), **(details or {})})
    return stable_row


@transaction.atomic
def set_release_guard(*, agent: Agent, metric: str, threshold: float, actor: Actor | None, window: int = 50, min_runs: int = 10,
                      enabled: bool = True) -> ReleaseGuard:
    who, user = acting_with_user(actor)
    require(who, "operate", agent.tenant_id, "change release guards")
    if metric not in GuardMetric.values:
        raise MarketplaceError(f"metric must be one of {', '.join(GuardMetric.values)}; got {metric!r}.", field="metric")
    if threshold < 0 or (metric != GuardMetric.COST_PER_RUN and threshold > 1):
        raise MarketplaceError("threshold must be a fraction from 0 to 1 for a rate (0.2 = 20 %), or ≥ 0 for a cost.", field="threshold")
    if window < 1 or not 1 <= min_runs <= window:
        raise MarketplaceError(f"window must be ≥ 1 and min_runs between 1 and window; got window {window}, min_runs {min_runs}.",
                               field="min_runs")
    guard, created = ReleaseGuard.objects.update_or_create(
        agent=agent, metric=metric,
        defaults={"tenant_id": agent.tenant_id, "threshold": threshold, "window": window, "min_runs": min_runs,
                  "enabled": enabled, "updated_by": user},
    )
    record_change(tenant=agent.tenant, actor=who, action="release.guard_created" if created else "release.guard_changed",
                  target=guard, details={"metric": metric, "threshold": threshold, "window": window, "min_runs": min_runs,
                                         "enabled": enabled})
    return guard


def guard_value(metric: str, runs: list[tuple[str, Any]]) -> float:
    """The metric over (terminal_reason, usage) pairs of finished runs."""
    if not runs:
        return 0.0
    if metric == GuardMetric.ERROR_RATE:
        return sum(reason in ERROR_REASONS for reason, _ in runs) / len(runs)
    if metric == GuardMetric.REJECTION_RATE:
        return sum(reason == "rejected" for reason, _ in runs) / len(runs)
    total = 0.0
    for _, usage in runs:
        try:
            total += float((usage or {}).get("cost") or 0)
        except (TypeError, ValueError):
            continue
    return total / len(runs)


@dataclass(frozen=True)
class GuardTrip:
    agent_id: int
    version: int
    metric: str
    value: float
    threshold: float
    runs: int


def check_release_guards(*, agent_ids: list[int] | None = None) -> list[GuardTrip]:
    """Roll back every candidate version whose guard metric is above its threshold. Idempotent; run it often.

    A candidate is a version with weight > 0 that is not the agent's current (stable) version. Only
    its finished runs since its weight last went above 0 count, at most ``window`` of them, and no
    decision is taken before ``min_runs``.
    """
    guards = ReleaseGuard.objects.filter(enabled=True).select_related("agent")
    if agent_ids is not None:
        guards = guards.filter(agent_id__in=agent_ids)
    trips: list[GuardTrip] = []
    now = timezone.now()
    for guard in guards:
        agent = guard.agent
        candidates = (ReleaseWeight.objects.filter(agent=agent, weight__gt=0).exclude(version_id=agent.current_version_id)
                      .select_related("version"))
        value = None
        for candidate in candidates:
            runs_qs = Run.objects.filter(agent=agent, version=candidate.version, status=RunStatus.FINISHED)
            if candidate.live_since is not None:
                runs_qs = runs_qs.filter(created_at__gte=candidate.live_since)
            ordered = runs_qs.order_by("-finished_at", "-created_at")
            if guard.metric == GuardMetric.CHECKS:  # the release gate's checks on live traffic (marketplace/gate.py)
                live = list(ordered.values_list("terminal_reason", "usage", "output", "step")[: guard.window])
                runs = [(r[0], r[1]) for r in live]
                if len(runs) < guard.min_runs:
                    continue
                value, _judged = gate.live_check_failure_rate(agent, candidate.version, live, guard.window)
                if value is None:
                    continue  # nothing to judge by: no gate, no finished replay, or no check a live run can be judged by
            else:
                runs = list(ordered.values_list("terminal_reason", "usage")[: guard.window])
                if len(runs) < guard.min_runs:
                    continue
                value = guard_value(guard.metric, runs)
            if value <= guard.threshold:
                continue
            why = (f"{guard.get_metric_display()} of v{candidate.version.number} was {value:.3g} over its last {len(runs)} "
                   f"finished runs, above the guard's threshold {guard.threshold:g}")
            try:
                rolled = rollback_version(agent=agent, version=candidate.version, actor=None, reason=why,
                                          details={"guard": guard.pk, "metric": guard.metric, "value": value,
                                                   "threshold": guard.threshold, "runs": len(runs)})
            except MarketplaceError as exc:
                log.warning("release guard %s could not roll back %s: %s", guard.pk, candidate.version, exc)
                continue
            if rolled is not None:
                log.warning("release guard rolled back %s: %s", candidate.version, why)
                trips.append(GuardTrip(agent.pk, candidate.version.number, guard.metric, value, guard.threshold, len(runs)))
                ReleaseGuard.objects.filter(pk=guard.pk).update(last_tripped_at=now)
        ReleaseGuard.objects.filter(pk=guard.pk).update(last_checked_at=now, last_value=value)
    return trips




@transaction.atomic
def set_tool_rollout(*, tool: Tool, enabled_percent: int | None, actor: Actor | None) -> ToolRollout | None:
    """Release a tool to this share of sessions (sticky per session); ``None`` removes the gray release (everyone)."""
    who, user = acting_with_user(actor)
    require(who, "operate", tool.tenant_id, "change tool rollouts")
    previous = ToolRollout.objects.filter(tool=tool).values_list("enabled_percent", flat=True).first()
    if enabled_percent is None:
        ToolRollout.objects.filter(tool=tool).delete()
        rollout = None
    else:
        if isinstance(enabled_percent, bool) or not isinstance(enabled_percent, int) or not 0 <= enabled_percent <= 100:
            raise MarketplaceError(f"enabled_percent must be a whole number from 0 to 100; got {enabled_percent!r}.",
                                   field="enabled_percent")
        rollout, _ = ToolRollout.objects.update_or_create(
            tool=tool, defaults={"tenant_id": tool.tenant_id, "enabled_percent": enabled_percent, "updated_by": user})
    record_change(tenant=tool.tenant, actor=who, action="tool.rollout_set", target=tool,
                  details={"enabled_percent": enabled_percent, "previous": previous})
    return rollout
