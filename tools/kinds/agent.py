"""Kind ``agent``: another agent of the tenant answers (``config = {"agent": "<slug>"}``); see tools.agent_exec."""

from __future__ import annotations

from typing import Any

from tools import handlers
from tools.agent_exec import DEFAULT_PARAMETERS, run_agent
from tools.kinds.base import AddProblem, Kind


def check(config: dict[str, Any], parameters: dict[str, Any], tenant: Any, add: AddProblem) -> None:
    slug = config.get("agent")
    if not isinstance(slug, str) or not slug:
        add("agent", "must be the slug of an agent of this tenant")
    elif tenant is not None and handlers.agents.agent_exists and not handlers.agents.agent_exists(tenant, slug):
        known = ", ".join(handlers.agents.agent_slugs(tenant, 20) if handlers.agents.agent_slugs else []) or "none"
        add("agent", f"there is no agent {slug!r} in this tenant. Known agents: {known}.")


#: Another agent needs longer than a function.
KIND = Kind(name="agent", execute=run_agent, check=check, default_timeout=120.0, default_parameters=DEFAULT_PARAMETERS)
