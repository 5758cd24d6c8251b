"""The agent loop: PLANNING -> ACTING -> OBSERVING -> ... -> FINISHED, one committed step at a time.

A step is one model call plus the tool calls it asked for. Each step ends with exactly one
``RunStore.commit_step`` so a crash loses at most the step in flight, and a resumed run
continues from the last committed step. A tool call that needs a human pauses the run in
WAITING; resuming re-offers the pending calls to the executor, which knows the decision.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from agents.runtime.protocols import Checkpoint, ModelClient, RunStore, StepAck, StepRecord, ToolExecutor
from agents.runtime.types import (
    Event,
    Message,
    ModelRequest,
    ModelResponse,
    Phase,
    TerminalReason,
    ToolCall,
    ToolContext,
    ToolOutcome,
    ToolSpec,
    ToolStatus,
    new_span_id,
)

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    model: str
    system_prompt: str
    tools: list[ToolSpec] = field(default_factory=list)
    max_recursion: int = 10


@dataclass(frozen=True)
class LoopResult:
    phase: Phase
    terminal_reason: TerminalReason | None
    output: str | None
    steps: int


class _Step:
    """Accumulates what one step will commit."""

    def __init__(self, checkpoint: Checkpoint, root_span: str) -> None:
        self.number = checkpoint.step + 1
        self.phase = checkpoint.phase
        self.root_span = root_span
        self.events: list[Event] = []
        self.appended: list[Message] = []
        self.pending: list[dict[str, Any]] = []
        self.terminal_reason: TerminalReason | None = None
        self.output: str | None = None

    def emit(self, type_: str, payload: dict[str, Any], *, span_id: str | None = None, parent: str | None = None) -> Event:
        parent_span = self.root_span if parent is None else (parent or None)
        event = Event(type_, payload, span_id=span_id or new_span_id(), parent_span_id=parent_span)
        self.events.append(event)
        return event

    def transition(self, to: Phase, reason: str) -> None:
        self.emit("state.transition", {"from": self.phase.value, "to": to.value, "reason": reason, "step": self.number})
        self.phase = to


class AgentLoop:
    def __init__(self, config: AgentConfig, model: ModelClient, tools: ToolExecutor, store: RunStore) -> None:
        self.config = config
        self.model = model
        self.tools = tools
        self.store = store

    def run(self, run_id: str) -> LoopResult:
        """Run from the last committed step until the run finishes, pauses, or is told to stop."""
        checkpoint = self.store.load(run_id)
        root_span = checkpoint.state.get("_root_span") or new_span_id()
        checkpoint.state["_root_span"] = root_span
        while checkpoint.phase != Phase.FINISHED:
            step = _Step(checkpoint, root_span)
            if checkpoint.step == 0:
                # The context assembled for a fresh run is persisted with its first step.
                step.appended, checkpoint.messages = checkpoint.messages, []
                step.emit("run.started", {"model": self.config.model, "tools": [t.name for t in self.config.tools]}, span_id=root_span, parent="")
            if checkpoint.phase == Phase.WAITING:
                self._resume_pending(run_id, checkpoint, step)
            elif checkpoint.step >= self.config.max_recursion:
                self._finish(step, TerminalReason.MAX_RECURSION, self._max_recursion_message())
            else:
                self._model_step(run_id, checkpoint, step)
            ack = self._commit(run_id, checkpoint, step)
            if step.phase == Phase.WAITING or ack.lease_lost:
                break
            if ack.cancel_requested and step.phase != Phase.FINISHED:
                cancel = _Step(checkpoint, root_span)
                self._finish(cancel, TerminalReason.CANCELLED, None, reason="cancel requested")
                self._commit(run_id, checkpoint, cancel)
        return LoopResult(checkpoint.phase, checkpoint.state.get("_terminal_reason"), checkpoint.state.get("_output"), checkpoint.step)

    # -- one step -------------------------------------------------------------------------

    def _model_step(self, run_id: str, checkpoint: Checkpoint, step: _Step) -> None:
        if step.phase != Phase.PLANNING:
            step.transition(Phase.PLANNING, "next step")
        request = ModelRequest(
            model=self.config.model,
            messages=checkpoint.messages + step.appended,
            tools=list(self.config.tools),
            metadata={"run_id": run_id, "step": step.number},
        )
        span = new_span_id()
        try:
            response = self.model.complete(request)
        except Exception as exc:  # the model gateway turns provider faults into exceptions with readable text
            log.warning("model call failed for run %s: %s", run_id, exc)
            step.emit("model.error", {"model": request.model, "error": str(exc)}, span_id=span)
            self._finish(step, TerminalReason.ERROR, None, reason=f"model call failed: {exc}")
            return
        self._record_model_call(step, request, response, span)
        checkpoint.usage = checkpoint.usage + response.usage
        step.appended.append(response.as_message())
        if not response.tool_calls:
            self._finish(step, TerminalReason.FINAL_ANSWER, response.content or "", reason="the model answered")
            return
        step.transition(Phase.ACTING, f"the model asked for {len(response.tool_calls)} tool call(s)")
        self._act(run_id, step, response.tool_calls)

    def _resume_pending(self, run_id: str, checkpoint: Checkpoint, step: _Step) -> None:
        calls = [ToolCall(c["id"], c["name"], c["arguments"]) for c in checkpoint.pending_calls]
        step.transition(Phase.ACTING, "resumed after a decision")
        self._act(run_id, step, calls)

    def _act(self, run_id: str, step: _Step, calls: list[ToolCall]) -> None:
        pending: list[ToolCall] = []
        for index, call in enumerate(calls):
            outcome = self._call_tool(run_id, step, call)
            if outcome.pending:
                pending = calls[index:]
                break
            step.appended.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": outcome.content})
        if pending:
            step.pending = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in pending]
            step.transition(Phase.WAITING, f"tool call {pending[0].name} waits for approval")
            return
        step.transition(Phase.OBSERVING, "tool results observed")

    def _call_tool(self, run_id: str, step: _Step, call: ToolCall) -> ToolOutcome:
        span = new_span_id()
        try:
            outcome = self.tools.execute(call, ToolContext(run_id=run_id, step=step.number, span_id=span))
        except Exception as exc:  # an executor must not raise; if it does, the model still gets an answer
            log.exception("tool executor raised for run %s call %s", run_id, call.id)
            outcome = ToolOutcome(call.id, ToolStatus.ERROR, f"The tool {call.name} failed unexpectedly: {exc}")
        for extra in outcome.trace:
            step.emit(str(extra.get("type", "tool.stage")), extra, parent=span)
        step.emit(
            "tool.call",
            {"tool": call.name, "call_id": call.id, "status": outcome.status.value, "result": outcome.content[:2000]},
            span_id=span,
        )
        return outcome

    def _record_model_call(self, step: _Step, request: ModelRequest, response: ModelResponse, span: str) -> None:
        for extra in response.trace:
            step.emit(str(extra.get("type", "model.attempt")), extra, parent=span)
        step.emit(
            "model.call",
            {
                "model": response.model,
                "input_tokens": response.usage.input_tokens,
                "output_tokens": response.usage.output_tokens,
                "cost": response.usage.cost,
                "finish_reason": response.finish_reason,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls],
                "content": response.content,
                "messages_in": len(request.messages),
            },
            span_id=span,
        )

    def _finish(self, step: _Step, terminal: TerminalReason, output: str | None, *, reason: str = "") -> None:
        step.terminal_reason = terminal
        step.output = output
        step.transition(Phase.FINISHED, reason or terminal.value)
        step.emit("run.finished", {"terminal_reason": terminal.value, "output": output, "reason": reason or terminal.value})

    def _max_recursion_message(self) -> str:
        return (
            f"I stopped after {self.config.max_recursion} steps without reaching an answer. "
            "Please narrow the request or contact an operator."
        )

    def _commit(self, run_id: str, checkpoint: Checkpoint, step: _Step) -> StepAck:
        """Commit the step and advance the in-memory checkpoint to match what is now durable."""
        if step.terminal_reason is not None:
            checkpoint.state["_terminal_reason"] = step.terminal_reason.value
            checkpoint.state["_output"] = step.output
        record = StepRecord(
            step=step.number,
            phase=step.phase,
            appended_messages=step.appended,
            state=dict(checkpoint.state),
            usage=checkpoint.usage,
            events=step.events,
            pending_calls=step.pending,
            terminal_reason=step.terminal_reason,
            output=step.output,
        )
        ack = self.store.commit_step(run_id, record)
        checkpoint.step = step.number
        checkpoint.phase = step.phase
        checkpoint.messages.extend(step.appended)
        checkpoint.pending_calls = step.pending
        return ack
