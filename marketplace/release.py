"""Gray release: which agent version (and whether a tool) a session gets.

Assignment is a pure function of (tenant, session): ``sha256`` of both picks a bucket 0..99, and the
bucket falls into one version's slice of the weights. The stable version's slice comes first, then
the candidates by version number, so ramping a candidate up only ever moves sessions *to* it, and
one conversation keeps its version as long as the weights do not take it away.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agents.hooks import VersionRefused
from agents.models import Run

if TYPE_CHECKING:
    from agents.models import Agent, AgentVersion

T = TypeVar("T")
BUCKETS = 100


class ReleaseRefused(VersionRefused):
    """A run cannot start with this agent now; the message says why and what to do."""


def bucket(tenant_id: Any, session_key: Any, *, salt: str = "") -> int:
    """A stable bucket in 0..99 for a session of a tenant (``salt`` separates independent rollouts)."""
    digest = hashlib.sha256(f"{salt}|{tenant_id}|{session_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def pick(weights: Sequence[tuple[T, int]], slot: int) -> T | None:
    """The item whose cumulative slice holds ``slot`` (weights in order; None if they sum to less)."""
    cumulative = 0
    for item, weight in weights:
        cumulative += weight
        if slot < cumulative:
            return item
    return None


def assign(weights: Sequence[tuple[T, int]], tenant_id: Any, session_key: Any) -> T | None:
    return pick(weights, bucket(tenant_id, session_key))


def weight_errors(weights: Mapping[int, int], *, known_numbers: Sequence[int], agent_slug: str) -> list[str]:
    """Readable problems with a set of weights by version number (empty: fine). An empty set clears the release."""
    errors: list[str] = []
    for number, weight in sorted(weights.items()):
        if number not in known_numbers:
            known = ", ".join(f"v{n}" for n in sorted(known_numbers)) or "none"
            errors.append(f"v{number} is not a version of agent {agent_slug!r}; its versions are {known}.")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= 100:
            errors.append(f"The weight of v{number} must be a whole number from 0 to 100; got {weight!r}.")
    if weights and not errors:
        total = sum(weights.values())
        if total != 100:
            listed = ", ".join(f"v{n} {w}" for n, w in sorted(weights.items()))
            errors.append(f"Weights must add up to 100; {listed} add up to {total}.")
    return errors


def ordered_weights(rows: Sequence[Any], stable_version_id: Any) -> list[tuple[Any, int]]:
    """(version, weight) in slice order: the stable version first, then candidates by number."""
    ordered = sorted(rows, key=lambda r: (r.version_id != stable_version_id, r.version.number))
    return [(r.version, r.weight) for r in ordered if r.weight > 0]


def _preset_key(agent_id: int) -> str | None:
    """The plugin an agent was made from (a preset), or None (read for every new run)."""
    from marketplace.models import PresetAgent

    return PresetAgent.objects.filter(agent_id=agent_id).order_by("pk").values_list("plugin_key", flat=True).first()


def _live_weights(agent_id: int) -> list[Any]:
    from marketplace.models import ReleaseWeight

    return list(ReleaseWeight.objects.filter(agent_id=agent_id, weight__gt=0).select_related("version"))


def version_for_session(*, agent: Agent, session_id: Any) -> AgentVersion | None:
    """The version a new run of this session gets, or None when no release is configured (use the current one).

    Refuses an agent made from a plugin preset whose plugin the tenant no longer has installed and enabled.
    """
    from marketplace.models import ACTIVE_INSTALL_STATUSES, PluginInstall

    origin = _preset_key(agent.pk)
    if origin is not None:
        install = PluginInstall.objects.filter(tenant_id=agent.tenant_id, plugin_key=origin).first()
        if install is None or install.status not in ACTIVE_INSTALL_STATUSES or install.plugin_id is None:
            state = "not installed" if install is None else install.get_status_display().lower()
            raise ReleaseRefused(f"The agent {agent.slug!r} comes from the plugin {origin!r}, which is {state} in this tenant; "
                                 "an operator must install or enable it before new runs can start.")
    rows = _live_weights(agent.pk)
    if not rows:
        return None
    return assign(ordered_weights(rows, agent.current_version_id), agent.tenant_id, session_id)


def observed_split(agent: Agent, *, last: int = 200) -> dict[int, tuple[int, float]]:
    """{version number: (runs, percent)} over the agent's last ``last`` runs: how the weights play out."""
    from collections import Counter

    numbers = list(Run.objects.filter(agent_id=agent.pk).order_by("-created_at").values_list("version__number", flat=True)[:last])
    counts = Counter(numbers)
    total = len(numbers)
    return {n: (c, 100.0 * c / total) for n, c in sorted(counts.items())}
