"""Agents as tools: a tool of kind ``agent`` (``config = {"agent": "<slug>"}``) runs another agent.

The call starts a child run of that agent in the same tenant, in a new session, created by the
parent run's user / API key, and executes it right here, in the gateway's worker thread,
through the handler the agents app registers (``agents/child_runs.py``: lease, loop, release). The child's answer is the tool's result::

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
from typing import TYPE_CHECKING, Any

from django.db import close_old_connections, connection

from tools import handlers
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
    run_child = handlers.agents.run_child
    if run_child is None:  # only a process without the agents app (never a worker)
        raise ToolFailure("error", f"The tool {tool.name} cannot run here: agents are not available in this process. "
                                   "Tell the user it is unavailable.")
    return run_child(tool, arguments, ctx)
