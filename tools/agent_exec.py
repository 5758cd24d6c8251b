"""Agents as tools: a tool of kind ``agent`` (``config = {"agent": "<slug>"}``) runs another agent.

The call starts a child run of that agent in the same tenant, in a new session, created by the
parent run's user / API key, and executes it right here, in the gateway's worker thread,
through ``agents.services`` (lease, loop, release). The child's answer is the tool's result::

    {"answer": "...", "child_run": "<uuid>", "agent": "<slug>"}

so the parent's trace and audit link the child run; the child's facts carry ``parent_run``,
``parent_agent`` and ``agent_depth`` (business keys: the runtime keeps ``_`` keys for itself, and a
client cannot set these, see :mod:`tools.guardrails`). Depth is limited (:data:`MAX_AGENT_DEPTH`): a chain deeper than that is refused,
which also ends any recursion (an agent calling itself). A child that pauses for an approval,
is cancelled or fails gives the model a failure saying so, with the child run's id.

The lease is taken in the transaction that creates the child, so the Celery task enqueued on
commit finds it held and leaves it alone; if this thread dies, the lease expires and the run
is recovered like any other.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from django.db import close_old_connections, connection, transaction

from tools.executors import ToolFailure

if TYPE_CHECKING:
    from tools.executors import ExecContext
    from tools.models import Tool

#: How many agents deep a chain of agent tools may go (the top-level run is depth 0).
MAX_AGENT_DEPTH = 3
#: The parameters an agent tool gets when the operator does not define its own.
DEFAULT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The full request for the other agent, in plain words."}},
    "required": ["input"],
    "additionalProperties": False,
}


def child_input(arguments: dict[str, Any]) -> str:
    text = arguments.get("input")
    if isinstance(text, str) and text.strip() and len(arguments) == 1:
        return text
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


def run_agent(tool: Tool, arguments: dict[str, Any], ctx: ExecContext) -> Any:
    """The executor for kind ``agent``."""
    close_old_connections()
    try:
        return _run_child(tool, arguments, ctx)
    finally:
        if not connection.in_atomic_block:
            connection.close()  # this runs in the gateway's pool thread: leave no connection open per thread


def _run_child(tool: Tool, arguments: dict[str, Any], ctx: ExecContext) -> Any:
    from agents import services
    from agents.engine import build_loop
    from agents.models import Agent, Run, RunStatus
    from runtime.types import TerminalReason
    from tenants.scoping import Actor

    parent = ctx.run
    slug = str((tool.config or {}).get("agent", ""))
    depth = int((parent.facts or {}).get("agent_depth", 0)) + 1
    if depth > MAX_AGENT_DEPTH:
        raise ToolFailure("denied", f"The tool {tool.name} would start agent {slug!r} {depth} agents deep; at most "
                                    f"{MAX_AGENT_DEPTH} are allowed. Do not call it again; answer with what you have.")
    agent = Agent.objects.for_tenant(ctx.tenant_id).select_related("tenant").filter(slug=slug).first()
    if agent is None:
        raise ToolFailure("error", f"The tool {tool.name} points to an agent {slug!r} that does not exist in this tenant. "
                                   "Tell the user it is unavailable.")
    inherited = {k: v for k, v in {**(parent.session.facts or {}), **(parent.facts or {})}.items() if not k.startswith("_")}
    actor = Actor(user=parent.created_by, api_key=parent.api_key)
    token = uuid.uuid4().hex
    try:
        with transaction.atomic():
            child = services.start_run(actor=actor, agent=agent, text=child_input(arguments), facts=inherited)
            facts = {**child.facts, "parent_run": str(parent.pk), "parent_agent": parent.agent.slug, "agent_depth": depth}
            Run.objects.filter(pk=child.pk).update(facts=facts)
            held = services.acquire_lease(str(child.pk), token)
    except services.RunRefused as exc:
        raise ToolFailure("error", f"The agent {slug!r} refused the request: {exc}") from None
    if held is None:  # not expected: the row was created just now
        raise ToolFailure("error", f"The agent {slug!r} could not be started (child run {child.pk}).")
    child_id = str(child.pk)
    try:
        build_loop(held, token).run(child_id)
    except Exception as exc:
        with transaction.atomic():
            current = Run.objects.select_for_update().get(pk=child_id)
            if current.status != RunStatus.FINISHED and current.lease_token == token:
                services.finish_without_worker(current, TerminalReason.ERROR, f"internal error: {type(exc).__name__}")
    finally:
        services.release_lease(child_id, token)
    done = Run.objects.get(pk=child_id)
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
