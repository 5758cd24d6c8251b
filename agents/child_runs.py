"""The child run behind an agent-kind tool (see :mod:`tools.agent_exec`), registered at start-up.

The tool layer knows nothing of runs: ``AgentsConfig.ready()`` registers :func:`run_child` and the
agent lookups in :mod:`tools.handlers`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.db import transaction

from agents import services
from agents.engine import build_loop
from agents.models import Agent, AgentKind, AgentVersion, Run, RunStatus
from core.outages import dependency_down
from runtime.types import TerminalReason
from tenants.scoping import Actor
from tools.agent_exec import MAX_AGENT_DEPTH, child_input
from tools.executors import ExecContext, ToolFailure
from tools.kinds.agent import AgentConfig
from tools.kinds.base import read_config
from tools.models import Tool


def run_child(tool: Tool, arguments: dict[str, Any], ctx: ExecContext) -> Any:
    """Start the child run of an agent-kind tool and run it here, in the gateway's worker thread."""
    parent = ctx.run
    slug = read_config(AgentConfig, tool).agent
    depth = int((parent.facts or {}).get("agent_depth", 0)) + 1
    if depth > MAX_AGENT_DEPTH:
        raise ToolFailure("denied", f"The tool {tool.name} would start agent {slug!r} {depth} agents deep; at most "
                                    f"{MAX_AGENT_DEPTH} are allowed. Do not call it again; answer with what you have.")
    agent = Agent.objects.for_tenant(ctx.tenant_id).select_related("tenant").filter(slug=slug, kind=AgentKind.AGENT).first()
    if agent is None:
        raise ToolFailure("error", f"The tool {tool.name} points to an agent {slug!r} that does not exist in this tenant. "
                                   "Tell the user it is unavailable.")
    try:
        done = run_as_child(parent, agent, child_input(arguments), depth)
    except services.RunRefused as exc:
        raise ToolFailure("error", f"The agent {slug!r} refused the request: {exc}") from None
    child_id = str(done.pk)
    if done.status == RunStatus.WAITING:
        raise ToolFailure("error", f"The agent {slug!r} paused waiting for a human approval (child run {child_id}); "
                                   "its answer is not available yet. Tell the user the request is waiting for approval.")
    if done.status != RunStatus.FINISHED:
        raise ToolFailure("error", f"The agent {slug!r} did not finish (status {done.status}, child run {child_id}). "
                                   "No answer was obtained.")
    if done.terminal_reason != TerminalReason.FINAL_ANSWER.value:
        why = done.error or done.terminal_reason
        raise ToolFailure("error", f"The agent {slug!r} ended without an answer ({done.terminal_reason}: {why}; "
                                   f"child run {child_id}). Do not tell the user it succeeded.")
    return {"answer": done.output, "child_run": child_id, "agent": slug}


def run_as_child(parent: Run, agent: Agent, text: str, depth: int) -> Run:
    """Start ``agent``'s run as a child of ``parent`` (its facts name ``parent_run``) and run it here to its end or
    pause; returns the child run as it ended. Used by agent-kind tools and by supervisors (agents/supervisor.py).
    Raises ``services.RunRefused`` when the child cannot start."""
    inherited = {k: v for k, v in {**(parent.session.facts or {}), **(parent.facts or {})}.items() if not k.startswith("_")}
    actor = Actor(user=parent.created_by, api_key=parent.api_key)
    token = uuid.uuid4().hex
    with transaction.atomic():
        child = services.start_run(actor=actor, agent=agent, text=text, facts=inherited)
        facts = {**child.facts, "parent_run": str(parent.pk), "parent_agent": parent.agent.slug, "agent_depth": depth}
        Run.objects.filter(pk=child.pk).update(facts=facts)
        held = services.acquire_lease(str(child.pk), token)
    if held is None:  # not expected: the row was created just now
        raise services.RunRefused(f"The agent {agent.slug!r} could not be started (child run {child.pk}).")
    return _run_held(held, token)


def _run_held(held: Run, token: str) -> Run:
    from agents.supervisor import supervise, supervisor_of  # a sub-agent may itself be a supervisor

    child_id = str(held.pk)
    try:
        supervisor = supervisor_of(held)
        if supervisor is not None:
            supervise(held, supervisor)
        else:
            build_loop(held, token).run(child_id)
    except Exception as exc:
        if dependency_down(exc) is not None:
            raise  # the database or Redis, not the run: the supervisor's worker counts it a crash (agents/services.py)
        with transaction.atomic():
            current = Run.objects.select_for_update().get(pk=child_id)
            if current.status != RunStatus.FINISHED and current.lease_token == token:
                services.finish_without_worker(current, TerminalReason.ERROR, f"internal error: {type(exc).__name__}")
    finally:
        services.release_lease(child_id, token)
    return Run.objects.select_related("agent").get(pk=child_id)


def resume_child(child: Run, *, wait_seconds: float, poll: float = 0.5) -> Run:
    """A child run left by a dead worker: run it here if no live worker holds it, else wait (at most
    ``wait_seconds``) for the worker that does. Returns the child as it is then (finished, waiting or still running)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        token = uuid.uuid4().hex
        held = services.acquire_lease(str(child.pk), token)
        if held is not None:
            return _run_held(held, token)
        current = Run.objects.select_related("agent").get(pk=child.pk)
        if current.status in (RunStatus.FINISHED, RunStatus.WAITING) or time.monotonic() >= deadline:
            return current
        time.sleep(poll)


def agent_slugs(tenant: Any, limit: int) -> list[str]:
    return list(Agent.objects.for_tenant(tenant).filter(kind=AgentKind.AGENT).values_list("slug", flat=True)[:limit])


def agent_exists(tenant: Any, slug: str) -> bool:
    """An agent (not a flow: flows do not run as a tool's child run) of the tenant."""
    return Agent.objects.for_tenant(tenant).filter(slug=slug, kind=AgentKind.AGENT).exists()


def agents_using(tool: Tool, current_only: bool) -> list[str]:
    if current_only:
        rows = Agent.objects.for_tenant(tool.tenant_id).filter(current_version__isnull=False).values_list("slug", "current_version__tools")
    else:
        rows = AgentVersion.objects.for_tenant(tool.tenant_id).values_list("agent__slug", "tools")
    return sorted({slug for slug, names in rows if isinstance(names, list) and tool.name in names})
