"""The gateway's policy decisions as pure functions, shared by the live gateway and the shadow replay (preview impact).

Each answers for one call of ``tool``: None when the call passes, else a :class:`Refusal` (the trace reason, the message
for the model, trace details). No queries, no clock: the live gateway and the preview cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tools import rate_limits

#: The fields of a tool that make its policy: what an impact preview may propose (agents/shadow.py).
PREVIEW_FIELDS = ("enabled", "required_scopes", "requires_approval", "approval_policy", "rate_limit_per_minute")


@dataclass(frozen=True)
class Refusal:
    stage: str
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


def switched_off(tool: Any) -> Refusal | None:
    """The kill switch."""
    if tool.enabled:
        return None
    return Refusal("resolve", "switched off by an operator",
                   f"The tool {tool.name} is switched off by an operator. Do not retry it; tell the user it is unavailable.")


def not_authorized(tool: Any, whitelist: Iterable[str], grants: Iterable[str]) -> Refusal | None:
    """The version's allow-list of tools, then the scopes the tool requires against those the conversation holds."""
    if tool.name not in set(whitelist):
        return Refusal("authorize", "not in this agent version's tool list",
                       f"This agent may not use the tool {tool.name}. Do not retry it.")
    missing = sorted(set(tool.required_scopes or []) - set(grants))
    if missing:
        return Refusal("authorize", "missing scopes",
                       f"The tool {tool.name} needs permission this conversation was not granted ({', '.join(missing)}). "
                       "Tell the user you cannot do this here.", {"missing_scopes": missing})
    return None


def rate_limit_wait(store: Any, tenant_id: Any, tool: Any) -> float:
    """Take one call from the (tenant, tool) bucket in ``store``: 0 when admitted, else seconds to wait (no limit: 0)."""
    limit = tool.rate_limit_per_minute
    if not limit:
        return 0.0
    wait, _short = store.take(rate_limits.buckets(tenant_id, tool.name, limit))
    return float(wait)
