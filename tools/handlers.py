"""What the tool layer asks of the layer above it, which registers the answers at start-up.

``tools`` knows nothing of agents or runs (see .importlinter); where a tool needs them — an
agent-kind tool starts a child run, a tool's validation checks that the agent it names exists, a
tool that agent versions use may not be renamed — it calls a handler here, which the ``agents``
app registers in ``AgentsConfig.ready()`` (dependency inversion, not a function-local import).
Unregistered, start-up fails (core/slots.py: the agentops.E002 check).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from core import slots


@dataclass
class AgentHandlers:
    #: (tool, arguments, ExecContext) -> the tool's result: runs the child run of an agent-kind tool.
    run_child: Callable[[Any, dict[str, Any], Any], Any] | None = None
    #: (tenant, limit) -> the slugs of the tenant's agents (at most ``limit``).
    agent_slugs: Callable[[Any, int], list[str]] | None = None
    #: (tenant, slug) -> whether the tenant has that agent.
    agent_exists: Callable[[Any, str], bool] | None = None
    #: (run_id) -> whether a waiting run whose approvals are all decided was re-enqueued.
    resume_waiting_run: Callable[[Any], bool] | None = None
    #: (tool, current_only) -> the slugs of the agents whose (current) versions list the tool.
    agents_using: Callable[[Any, bool], list[str]] | None = None
    #: (tool=, actor=, fields=, days=) -> the impact of a proposed, unsaved policy change on recorded calls
    #: (agents/shadow.py); raises ToolRefused like saving would.
    preview_tool_impact: Callable[..., dict[str, Any]] | None = None


agents = AgentHandlers()
slots.declare("tools.handlers", "agents", lambda: [f.name for f in fields(agents) if getattr(agents, f.name) is None])


def register_agents(**handlers: Callable[..., Any]) -> None:
    """Called once by ``agents.apps.AgentsConfig.ready()``; an unknown name is a programming error."""
    for name, handler in handlers.items():
        if not hasattr(agents, name):
            raise TypeError(f"unknown agent handler {name!r}")
        setattr(agents, name, handler)
