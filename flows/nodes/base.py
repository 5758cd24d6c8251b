"""What every node kind's executor shares: the outcomes it raises, the attempt it runs, the inline waves' context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.hooks import tool_allowed_as_read, tool_allowed_for
from agents.models import Run
from audit.unit_of_work import StepAudit
from runtime.flows import BodyNode, FlowDefinition
from runtime.types import Event


class NodeFailed(Exception):
    """The node failed: its message is the row's error (its ``on_error`` decides what follows)."""


class NodeWaits(Exception):
    """The node waits for a person (an approval, a child run's approval): its task is freed."""


@dataclass
class Wave:
    """What the inline waves of one flow run in one thread share: its definition, its tools and the conversation's
    grants (resolved once, not per node), and the tool policy (kill switch, install, rollout) read once per tool per
    wave instead of once per call."""

    flow: FlowDefinition
    tools: list[Any]
    grants: set[str]
    checked: dict[Any, tuple[bool, str]] = field(default_factory=dict)
    #: the tools were read for the wave about to run (the first of this thread's): it decides their policy from that
    #: read; the later waves read it again
    fresh: bool = True
    #: the tenant's audit chain head as this thread's last commit of the run left it: (seq, hash), None if not known
    head: tuple[int, str] | None = None
    #: a guarded commit found another writer had come between: this run's later waves take the locked way
    contended: bool = False

    def tool_policy(self, tool: Any, tenant_id: int, session_key: Any) -> tuple[bool, str]:
        if tool.pk not in self.checked:
            decide = tool_allowed_as_read if self.fresh else tool_allowed_for
            self.checked[tool.pk] = decide(tool, tenant_id, session_key)
        return self.checked[tool.pk]


@dataclass
class Attempt:
    """One attempt at a node: its run and flow, the node (a map item's body node), its row's id, inputs and span, the
    scope its expressions read, and what it leaves for its completion (audit rows, trace events)."""

    run: Run
    flow: FlowDefinition
    node: BodyNode
    row_id: str
    inputs: dict[str, Any]
    scope: dict[str, Any]
    span: str
    audit: StepAudit
    trace: list[Event]
    wave: Wave | None = None
