"""Kind ``agent``: another agent of the tenant answers (``config = {"agent": "<slug>"}``); see tools.agent_exec."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator

from runtime.documents import problem, text
from tools import handlers
from tools.agent_exec import DEFAULT_PARAMETERS, run_agent
from tools.kinds.base import Kind, ToolConfig, saving


class AgentConfig(ToolConfig):
    """Another agent of the tenant, started as a child run."""

    agent: Annotated[str, text(nullable=False), Field(description="the slug of an agent of this tenant")]

    @field_validator("agent")
    @classmethod
    def _exists(cls, slug: str, info: ValidationInfo) -> str:
        context = saving(info)
        tenant = context["tenant"] if context is not None else None
        if tenant is not None and handlers.agents.agent_exists and not handlers.agents.agent_exists(tenant, slug):
            known = ", ".join(handlers.agents.agent_slugs(tenant, 20) if handlers.agents.agent_slugs else []) or "none"
            raise problem(f"there is no agent {slug!r} in this tenant. Known agents: {known}.")
        return slug


#: Another agent needs longer than a function.
KIND = Kind(name="agent", execute=run_agent, config_model=AgentConfig, default_timeout=120.0, default_parameters=DEFAULT_PARAMETERS)
