"""Executing a started node, one module per kind that runs: ``tool``, ``llm``, ``agent``, ``switch`` (an ``approval``
node asks a person and waits: ``approval``; a ``map`` node runs nothing itself: the planner opens and settles it,
``runtime/flow_plan.py``, and its items' nodes run here as tool, llm or switch nodes).

:func:`attempts` runs a node, its retries included, and says how it ended; nothing is committed here
(``flows/commit.py`` commits it)."""

from __future__ import annotations

import logging
import time
from typing import Any

from agents.models import Run
from audit.unit_of_work import StepAudit
from core.outages import dependency_down
from flows.models import FlowNodeRun, NodeStatus
from flows.nodes import agent, llm, switch, tool
from flows.nodes.base import Attempt, NodeFailed, NodeWaits, Wave
from runtime.flows import BodyNode, FlowDefinition
from runtime.types import Event

__all__ = ["Attempt", "NodeFailed", "NodeWaits", "Wave", "attempts", "execute"]

log = logging.getLogger(__name__)


def execute(a: Attempt, started: tool.Started | None = None) -> tuple[Any, list[str]]:
    """One attempt at the node: ``(output, chosen)``; ``NodeFailed`` or ``NodeWaits`` when it did not finish."""
    kind = a.node.kind
    if kind == "switch":
        return switch.run(a)
    if kind == "tool":
        return tool.run(a, started), []
    if kind == "llm":
        return llm.run(a), []
    if kind == "agent":
        return agent.run(a), []
    raise NodeFailed(f"{kind} nodes do not run yet in this version of the console")


def attempts(run: Run, flow: FlowDefinition, node: BodyNode, row: FlowNodeRun, scope: dict[str, Any], audit: StepAudit,
             trace: list[Event], *, item: bool = False, wave: Wave | None = None,
             started: tool.Started | None = None) -> tuple[str, Any, list[str], str]:
    """Run a started node (its retries included): ``(status, output, chosen, error)``; nothing is committed here.
    ``item``: a map's item node. ``started``: a tool node's first attempt, already begun (``tool.start_wave``)."""
    a = Attempt(run, flow, node, row.node_id, row.inputs, scope, row.span_id, audit, trace, wave)
    tries = 1 + (node.retries if node.kind in ("tool", "llm") else 0)
    began = started.began if started is not None else time.monotonic()
    output: Any = None
    chosen: list[str] = []
    for n in range(tries):
        status, result, error = _attempt(a, started if n == 0 else None, item=item)
        if result is not None:  # a failed attempt leaves the output an earlier one made (a success past its timeout)
            output, chosen = result
        if status == NodeStatus.DONE and time.monotonic() - began > node.timeout_seconds:
            status, error = NodeStatus.FAILED, f"timeout: the node took over {node.timeout_seconds:g}s"
        if status != NodeStatus.FAILED or n + 1 >= tries or not _retryable(a):
            break
        log.info("flow run %s: node %s attempt %s failed (%s); retrying", run.pk, row.node_id, n + 1, error)
    if status == NodeStatus.FAILED and node.on_error == "continue":
        output = {"error": error}
    return status, output, chosen, error


def _attempt(a: Attempt, started: tool.Started | None, *, item: bool) -> tuple[str, tuple[Any, list[str]] | None, str]:
    """One try: ``(status, (output, chosen) or None when it did not finish, error)``."""
    try:
        if "_mapping_error" in a.inputs:
            raise NodeFailed(f"an input mapping could not be evaluated: {a.inputs['_mapping_error']}")
        return NodeStatus.DONE, execute(a, started), ""
    except NodeWaits as exc:
        if item:  # nothing resumes a map's item for a person: it fails (its on_error applies)
            return NodeStatus.FAILED, None, f"a map's item cannot wait for an approval: {exc}"
        return NodeStatus.WAITING, None, str(exc)
    except NodeFailed as exc:
        return NodeStatus.FAILED, None, str(exc)
    except Exception as exc:
        if dependency_down(exc) is not None:
            # the database or Redis failed under the node, not the node: its row keeps its lease, which runs out, and
            # the node is started again (a write it began is found by its call key, flows/nodes/tool.py) (issue #50)
            raise
        log.exception("flow run %s: node %s failed", a.run.pk, a.row_id)
        return NodeStatus.FAILED, None, f"internal error: {type(exc).__name__}"


def _retryable(a: Attempt) -> bool:
    """Only llm nodes and tool nodes whose tool is idempotent are tried again."""
    return a.node.kind == "llm" or tool.retryable(a.node, a.run, a.wave.tools if a.wave else None)
