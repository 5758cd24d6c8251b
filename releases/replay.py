"""Replays a recorded run on a candidate version (issue #16): the pure runtime core with a cassette.

- The **store** is in memory: a replay writes no run, event, message, session turn or spend; only its result row
  (``ReplayRun``) is written, by the batch, in bulk.
- **Tools** are answered from the recording when the same tool was called with the same canonical arguments. The
  candidate's own policy still decides first, as the live gateway would: a tool it does not list, a switched-off tool,
  missing scopes are refused; a call its approval rules would hold is noted ("approvals that would have been
  needed") and answered from the recording. A miss (a call the recording does not hold) follows the batch's policy:
  ``stop`` ends the replayed run (``replay_miss``); ``live_read`` calls a **read** tool live through the real tool
  gateway (authorised and audited, its call id ``replay-<batch>-...``) and stops on anything else. **A write tool is
  never executed live in a replay**, whatever the policy.
- The **model** is the recording in ``recorded`` mode (each task's replies in order; no model call, no cost), or the
  candidate's model through the tenant's model gateway in ``live`` mode (no live deltas; costs counted by the batch).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from agents import hooks
from agents.engine import approval_overrides, initial_checkpoint, session_grants
from agents.extensions import registry as extension_registry
from agents.models import AgentKind, AgentVersion, Run
from agents.run_policy import effective_document
from approvals.gate import ApprovalGate
from audit.masking import mask_text, mask_value
from audit.unit_of_work import StepAudit
from flows.runner import version_definition
from releases.recording import Recording, canonical
from runtime.config import RuntimePolicy, build_runtime, parse_policy
from runtime.loop import AgentConfig
from runtime.protocols import Checkpoint, StepAck, StepRecord
from runtime.types import ModelRequest, ModelResponse, ToolCall, ToolContext, ToolOutcome, ToolSpec, ToolStatus, Usage
from tools import decisions
from tools.arguments import canonical_json
from tools.models import Tool, ToolCategory

MISS = "replay_miss"


class ReplayMiss(Exception):
    pass


@dataclass
class Candidate:
    """What every replay of one batch shares: the version, its tools, policy and prices, resolved once."""

    version: AgentVersion
    tools: list[Tool]
    policy: RuntimePolicy
    config: AgentConfig
    model_mode: str = "recorded"
    miss_policy: str = "stop"
    batch_id: Any = None

    @classmethod
    def build(cls, version: AgentVersion, *, model_mode: str, miss_policy: str, batch_id: Any = None) -> Candidate:
        from agents.model_clients import model_info_for

        probe = Run(tenant=version.tenant, agent=version.agent, version=version)
        names = [n for n in version.tools if isinstance(n, str)]
        if version.agent.kind == AgentKind.FLOW:  # a flow's tool nodes are its tool list
            names += sorted(version_definition(version).tool_names())
        tools = list(hooks.callable_tools(version.tenant_id).filter(name__in=names).order_by("name"))
        policy = parse_policy(effective_document(version.policy, version.tenant.settings), extensions=extension_registry())
        info = model_info_for(probe)
        config = AgentConfig(
            model=version.model, system_prompt=version.system_prompt,
            tools=[ToolSpec(t.name, t.description, t.parameters or {"type": "object", "properties": {}})
                   for t in tools if t.enabled],
            input_price_per_million=info.price_in_per_1m if info else 0.0,
            output_price_per_million=info.price_out_per_1m if info else 0.0,
            context_window=info.context_window if info else 128_000)
        return cls(version, tools, policy, config, model_mode, miss_policy, batch_id)

    def run_for(self, source: Run) -> Run:
        """An unsaved run of the candidate with the recorded run's inputs (never saved: a replay has no run row)."""
        run = Run(tenant=source.tenant, agent=source.agent, version=self.version, session=source.session,
                  created_by_id=source.created_by_id, api_key_id=source.api_key_id, input=source.input,
                  facts=source.facts, playground=True)
        run._runtime_policy = self.policy  # type: ignore[attr-defined]
        return run


class MemoryStore:
    """The replay's store: the initial checkpoint, then every committed step kept in memory."""

    def __init__(self, initial: Checkpoint) -> None:
        self.initial = initial
        self.records: list[StepRecord] = []
        self.stop = False

    def load(self, run_id: str) -> Checkpoint:
        return self.initial

    def commit_step(self, run_id: str, record: StepRecord) -> StepAck:
        self.records.append(record)
        return StepAck(cancel_requested=self.stop)


class CassetteModel:
    """The recorded replies, per task, in order."""

    def __init__(self, recording: Recording) -> None:
        self.queues = {task: list(replies) for task, replies in recording.responses.items()}

    def complete(self, request: ModelRequest) -> ModelResponse:
        queue = self.queues.get(request.task) or []
        if not queue:
            raise ReplayMiss(f"{MISS}: the recording holds no further {request.task!r} model reply")
        return queue.pop(0)


class CassetteTools:
    """Tool calls answered from the recording, after the candidate's own policy; misses per the batch's policy."""

    def __init__(self, candidate: Candidate, recording: Recording, run: Run, store: MemoryStore, gate: ApprovalGate,
                 grants: set[str]) -> None:
        self.candidate, self.store, self.run, self.gate, self.grants = candidate, store, run, gate, grants
        self.outcomes = {key: [o for o in outs if o[0] != ToolStatus.PENDING_APPROVAL] for key, outs in recording.outcomes.items()}
        self.by_name = {t.name: t for t in candidate.tools}
        self.whitelist = [n for n in candidate.version.tools if isinstance(n, str)]
        self.approvals: list[str] = []
        self.live_calls = 0
        self.misses: list[str] = []
        self.audit = StepAudit()

    def check(self, call: ToolCall) -> tuple[ToolOutcome | None, bool]:
        """The candidate's own policy on a call, as the gateway decides it: ``(refusal or None, needs an approval)``.
        A call its approval rules would hold is listed in ``approvals`` (a replay never waits for a person)."""
        tool = self.by_name.get(call.name)
        if tool is None:
            return ToolOutcome(call.id, ToolStatus.DENIED, f"This agent may not use the tool {call.name}. Do not retry it."), False
        refusal = decisions.switched_off(tool) or decisions.not_authorized(tool, self.whitelist, self.grants)
        if refusal is not None:
            return ToolOutcome(call.id, ToolStatus.DENIED, refusal.message), False
        try:
            arguments = json.loads(call.arguments) if call.arguments else {}
        except ValueError:
            arguments = {}
        needs = bool(isinstance(arguments, dict) and self.gate.rule(tool, arguments).needed)
        if needs:
            self.approvals.append(tool.name)
        return None, needs

    def execute(self, call: ToolCall, ctx: ToolContext) -> ToolOutcome:
        refused, needs = self.check(call)
        if refused is not None:
            return refused
        tool = self.by_name[call.name]
        key = canonical(call.name, call.arguments)
        recorded = self.outcomes.get(key)
        if recorded:
            status, content = recorded.pop(0) if len(recorded) > 1 else recorded[0]
            return ToolOutcome(call.id, ToolStatus(status) if status in ToolStatus.__members__.values() else ToolStatus.OK,
                               content)
        return self._miss(tool, call, ctx, key, needs)

    def _miss(self, tool: Tool, call: ToolCall, ctx: ToolContext, key: tuple[str, str], needs: bool) -> ToolOutcome:
        # the call as a report may quote it: the fields the tool declares sensitive masked, as on the approval page
        shown = key[1]
        try:
            shown = canonical_json(mask_value(json.loads(shown), tool.sensitive_fields or ()))
        except ValueError:
            shown = mask_text(shown)
        what = f"{call.name}({shown[:200]})"
        live = (self.candidate.miss_policy == "live_read" and tool.category == ToolCategory.READ
                and not needs)
        if not live:
            why = "a write tool is never called live in a replay" if tool.category != ToolCategory.READ else \
                "the replay's miss policy is stop" if self.candidate.miss_policy == "stop" else "it would need an approval"
            self.misses.append(f"{what}: {why}")
            self.store.stop = True  # the loop ends the run at this step's boundary
            return ToolOutcome(call.id, ToolStatus.ERROR, f"{MISS}: the recording holds no call {what} ({why}).")
        from tools.gateway import ToolGateway

        self.live_calls += 1
        source = self.run
        gateway = ToolGateway(run=source, tools=[tool], audit=self.audit, grants=self.grants, approvals=self.gate,
                              tool_policy=hooks.tool_allowed_for)
        gateway.whitelist = set(self.whitelist)
        live_call = ToolCall(f"replay-{self.candidate.batch_id}-{call.id}"[:99], call.name, call.arguments)
        outcome = gateway.execute(live_call, ctx)
        return ToolOutcome(call.id, outcome.status, outcome.content)


@dataclass
class Replayed:
    terminal_reason: str
    output: str
    steps: int
    usage: Usage
    latency_ms: float
    tools: list[dict[str, str]] = field(default_factory=list)
    approvals: list[str] = field(default_factory=list)
    live_tool_calls: int = 0
    misses: list[str] = field(default_factory=list)
    audit: StepAudit | None = None


def replay(candidate: Candidate, recording: Recording, *, model: Any = None) -> Replayed:
    """Run the candidate on one recording, in memory. ``model``: the live mode's client (else the cassette)."""
    source = recording.run
    run = candidate.run_for(source)
    gate = ApprovalGate(run, overrides=approval_overrides(run))
    store = MemoryStore(initial_checkpoint(run, None if not candidate.config.context_window else _Info(candidate.config),
                                           turns=recording.earlier_turns))
    tools = CassetteTools(candidate, recording, source, store, gate, session_grants(run))
    runtime = build_runtime(candidate.policy, candidate.config, extensions=extension_registry())
    loop = runtime.loop(model if model is not None else CassetteModel(recording), tools, store)
    began = time.perf_counter()
    result = loop.run(str(run.pk))
    latency = round((time.perf_counter() - began) * 1000, 1)
    terminal = result.terminal_reason.value if result.terminal_reason is not None else str(result.phase)
    if tools.misses:
        terminal = MISS
    output = mask_text(result.output or "")  # as a run's answer is stored (agents/store.py): compared like for like
    for record in store.records:  # a model reply the cassette did not hold ends the run with an error naming it
        for event in record.events:
            if event.type == "model.error" and MISS in str(event.payload.get("error", "")):
                terminal = MISS
                tools.misses.append(str(event.payload.get("error")))
    events = [event for record in store.records for event in record.events]
    outcome = {str(e.payload.get("call_id")): str(e.payload.get("status")) for e in events
               if e.type == "tool.call" and e.payload.get("status") != "pending_approval"}
    # each call the model asked for, with its outcome: a call the candidate refuses (a tool it lost) shows as changed
    called = [{"tool": k[0], "arguments": k[1], "status": outcome.get(str(c.get("id")), "")}
              for e in events if e.type == "model.call"
              for c in e.payload.get("tool_calls") or [] for k in [canonical(str(c.get("name")), c.get("arguments"))]]
    turns = sum(1 for record in store.records for event in record.events
                if event.type == "model.call" and event.payload.get("task", "act") == "act")
    return Replayed(terminal, output, turns, result.usage, latency, called, tools.approvals, tools.live_calls,
                    tools.misses, tools.audit)


@dataclass(frozen=True)
class _Info:
    """The context builder's view of the model (its window) without asking the gateway again per run."""

    config: AgentConfig

    @property
    def context_window(self) -> int:
        return self.config.context_window
