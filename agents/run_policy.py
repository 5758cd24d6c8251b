"""A run's policy, parsed once: the version's document with the tenant's tier table as its default, validated together.

The engine, the model routing and the approval gate read the same :class:`~runtime.config.RuntimePolicy` (memoised
on the run object), so the policy is parsed once per run and nothing edits it after validation. A tenant's tier
table (``tenant.settings["tiers"]``, set by a platform administrator) fills ``limits.tiers.table`` only where the
version leaves it empty, and is validated like the rest of the document: a broken table fails the run's start with
the path at fault, never silently.
"""

from __future__ import annotations

import copy
from typing import Any

from agents.extensions import registry as extension_registry
from runtime.config import RuntimePolicy, parse_policy


def effective_document(version_policy: dict[str, Any] | None, tenant_settings: dict[str, Any] | None) -> dict[str, Any]:
    """The document to validate: the version's, with the tenant's tier table where the version sets none."""
    document = copy.deepcopy(version_policy or {})
    tier_table = (tenant_settings or {}).get("tiers")
    if tier_table:
        limits = document.setdefault("limits", {}) if isinstance(document.get("limits", {}), dict) else None
        tiers = limits.setdefault("tiers", {}) if limits is not None and isinstance(limits.get("tiers", {}), dict) else None
        if tiers is not None and not tiers.get("table"):
            tiers["table"] = copy.deepcopy(tier_table)
    return document


def policy_for(run: Any) -> RuntimePolicy:
    """The run's validated policy (raises ``PolicyError`` listing every problem); parsed on first use."""
    cached = getattr(run, "_runtime_policy", None)
    if cached is None:
        cached = parse_policy(effective_document(run.version.policy, run.tenant.settings), extensions=extension_registry())
        run._runtime_policy = cached
    return cached
