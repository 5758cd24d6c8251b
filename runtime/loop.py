"""The agent loop: PLANNING -> ACTING -> OBSERVING -> ... -> FINISHED, one committed step at a time.

A step is one model call plus the tool calls it asked for (a resume from WAITING is a step of its
own). Each step ends with exactly one ``RunStore.commit_step`` so a crash loses at most the step in
flight, and a resumed run continues from the last committed step. A tool call that needs a human
pauses the run in WAITING; resuming re-offers the pending calls to the executor, which knows the
decision.

Stop layers, each ending the run with exactly one terminal reason:
1. the model answers without tool calls -> ``final_answer``;
2. a hook (limits, loop detection, custom) or a guard (budgets, wall time) ends it gracefully with
   a message for the user -> ``limit_reached``/``loop_detected``/``budget_exceeded``/``timeout``/...;
3. the hard ``max_recursion`` step cap -> ``max_recursion``.
Plus ``rejected`` (an approver said no), ``cancelled`` (operator) and ``error`` (model failure,
misconfigured hook).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from runtime.budgets import CallGuard, Stop
from runtime.calls import Begun, CallRunner
from runtime.compaction import CompactionContext, Compactor, render_view, request_tokens
from runtime.hooks import END, Hook, HookConfigError, HookContext, HookPosition, check_hook_names, check_result
from runtime.interceptors import ModelInterceptor, ToolInterceptor
from runtime.protocols import Checkpoint, EventSink, ModelClient, RunStore, StepAck, StepRecord, ToolExecutor
from runtime.state import (
    ACTIVE_SECONDS,
    ASSEMBLY,
    CONTEXT,
    LLM_CALL_COUNT,
    OUTPUT,
    ROOT_SPAN,
    TERMINAL_REASON,
    TOOL_FAILURE_STREAK,
    StateError,
    StateSchema,
)
from runtime.step import StepBuffer, StopRun, open_call_stubs
from runtime.types import (
    ModelRequest,
    ModelResponse,
    Phase,
    TerminalReason,
    ToolCall,
    ToolOutcome,
    ToolSpec,
    ToolStatus,
    Usage,
    copy_json,
    new_span_id,
)

log = logging.getLogger(__name__)

FAILED_TOOL_STATUSES = frozenset(
    {
        ToolStatus.ERROR,
        ToolStatus.TIMEOUT,
        ToolStatus.INVALID,
        ToolStatus.DENIED,
        ToolStatus.EGRESS_DENIED,
        ToolStatus.OUTCOME_UNKNOWN,
        ToolStatus.DUPLICATE_BLOCKED,
        ToolStatus.RATE_LIMITED,
    }
)


@dataclass
class AgentConfig:
    model: str
    system_prompt: str
    tools: list[ToolSpec] = field(default_factory=list)
    max_recursion: int = 10
    #: Sent as ``ModelRequest.max_output_tokens``; budgets assume every reply may use all of it.
    max_output_tokens: int = 1024
    #: Prices per 1M tokens, used for budgets and for usage a provider reports without a cost.
    input_price_per_million: float = 0.0
    output_price_per_million: float = 0.0
    context_window: int = 128_000
    #: An approver's rejection ends the run as ``rejected`` (else the model reads it and goes on).
    stop_on_rejection: bool = False
    #: At most this many of a turn's tool calls under way at once (when the executor can run them side by side).
    tool_calls_at_once: int = 8


@dataclass(frozen=True)
class LoopResult:
    phase: Phase
    terminal_reason: TerminalReason | None
    output: str | None
    steps: int
    usage: Usage = field(default_factory=Usage)


@dataclass
class _Run:
    run_id: str
    checkpoint: Checkpoint
    root_span: str
    base_seconds: float
    segment_start: float


class AgentLoop:
    def __init__(
        self,
        config: AgentConfig,
        model: ModelClient,
        tools: ToolExecutor,
        store: RunStore,
        *,
        hooks: Sequence[Hook] = (),
        model_interceptors: Sequence[ModelInterceptor] = (),
        tool_interceptors: Sequence[ToolInterceptor] = (),
        guards: Sequence[CallGuard] = (),
        compactors: Sequence[Compactor] = (),
        state_schema: StateSchema | None = None,
        sink: EventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        errors = check_hook_names([h.name for h in hooks])
        if errors:
            raise HookConfigError("; ".join(errors))
        self.config = config
        self.model = model
        self.tools = tools
        self.store = store
        self.hooks = list(hooks)
        self.model_interceptors = list(model_interceptors)
        self.tool_interceptors = list(tool_interceptors)
        self.guards = list(guards)
        self.compactors = list(compactors)
        self.schema = state_schema or StateSchema()
        self.sink = sink
        self.clock = clock
        self.calls = CallRunner(
            config,
            model,
            tools,
            model_interceptors=model_interceptors,
            tool_interceptors=tool_interceptors,
            guards=guards,
            clock=clock,
        )

    def run(self, run_id: str) -> LoopResult:
        """Run from the last committed step until the run finishes, pauses, or is told to stop."""
        checkpoint = self.store.load(run_id)
        root_span = str(checkpoint.state.get(ROOT_SPAN) or new_span_id())
        checkpoint.state[ROOT_SPAN] = root_span
        run = _Run(run_id, checkpoint, root_span, float(checkpoint.state.get(ACTIVE_SECONDS, 0.0)), self.clock())
        while checkpoint.phase != Phase.FINISHED:
            step = StepBuffer(checkpoint, root_span)
            self._run_step(run, step)
            ack = self._commit(run, step)
            if ack.lease_lost:
                break
            if ack.cancel_requested and not step.finished:
                cancel = StepBuffer(checkpoint, root_span)
                self._end(run, cancel, Stop(TerminalReason.CANCELLED, None, "cancel requested by an operator"))
                self._commit(run, cancel)
            if step.phase == Phase.WAITING:
                break
        state = checkpoint.state
        terminal = state.get(TERMINAL_REASON)
        return LoopResult(
            checkpoint.phase,
            TerminalReason(terminal) if terminal else None,
            state.get(OUTPUT),
            checkpoint.step,
            checkpoint.usage,
        )

    # -- one step -------------------------------------------------------------------------

    def _run_step(self, run: _Run, step: StepBuffer) -> None:
        checkpoint = run.checkpoint
        first = checkpoint.step == 0
        if first:
            # The context assembled for a fresh run is persisted with its first step.
            step.appended, checkpoint.messages = checkpoint.messages, []
            tokens = request_tokens(step.appended, self.config.tools, self.config.model)
            step.emit(
                "run.started",
                {
                    "model": self.config.model,
                    "tools": [t.name for t in self.config.tools],
                    "context_tokens": tokens,
                    "context": step.state.get(ASSEMBLY, []),
                    "hooks": [h.name for h in self.hooks],
                },
                span_id=run.root_span,
                parent="",
            )
        try:
            if checkpoint.cancel_requested:
                raise StopRun(Stop(TerminalReason.CANCELLED, None, "cancel requested by an operator"))
            if first:
                self._run_hooks(run, step, HookPosition.BEFORE_AGENT)
            if checkpoint.phase == Phase.WAITING:
                step.transition(Phase.ACTING, "resumed after a decision")
                calls = [ToolCall(c["id"], c["name"], c["arguments"]) for c in checkpoint.pending_calls]
                self._act(run, step, calls)
            elif checkpoint.step >= self.config.max_recursion:
                raise StopRun(Stop(TerminalReason.MAX_RECURSION, self._max_recursion_message(), self._max_recursion_reason()))
            else:
                self._model_step(run, step)
        except StopRun as stop:
            self._end(run, step, stop.stop)
        except StateError as exc:  # a hook wrote 'messages', a '_' key, or a value that is not JSON
            step.emit("hook.error", {"error": str(exc)})
            self._end(run, step, Stop(TerminalReason.ERROR, None, f"configuration error: {exc}"))
        except Exception as exc:  # a bug in a compactor or custom code: end visibly instead of crashing every retry
            log.exception("run %s step %s failed", run.run_id, step.number)
            self._end(run, step, Stop(TerminalReason.ERROR, None, f"internal error: {type(exc).__name__}: {exc}"))

    def _model_step(self, run: _Run, step: StepBuffer) -> None:
        if step.phase != Phase.PLANNING:
            step.transition(Phase.PLANNING, "next step")
        self._run_hooks(run, step, HookPosition.BEFORE_MODEL)
        log_ = run.checkpoint.messages + step.appended
        self._compact(run, step, log_)
        request = ModelRequest(
            model=self.config.model,
            messages=render_view(log_, step.state),
            tools=list(self.config.tools),
            metadata={"run_id": run.run_id, "step": step.number},
            max_output_tokens=self.config.max_output_tokens,
        )
        response = self._call_model(run, step, request)
        step.appended.append(response.as_message())
        self._run_hooks(run, step, HookPosition.AFTER_MODEL, response=response)
        if not response.tool_calls:
            self._end(run, step, Stop(TerminalReason.FINAL_ANSWER, response.content or "", "the model answered"))
            return
        step.transition(Phase.ACTING, f"the model asked for {len(response.tool_calls)} tool call(s)")
        self._act(run, step, response.tool_calls)

    def _compact(self, run: _Run, step: StepBuffer, log_: list[dict[str, Any]]) -> None:
        ctx = CompactionContext(self.config.model, self.config.tools, self.config.context_window, lambda r: self._call_model(run, step, r))
        for compactor in self.compactors:
            before = request_tokens(render_view(log_, step.state), self.config.tools, self.config.model)
            update = compactor.compact(log_, step.state, ctx)
            if update is None:
                continue
            step.state = {**step.state, CONTEXT: update}
            after = request_tokens(render_view(log_, step.state), self.config.tools, self.config.model)
            step.emit(
                "context.summarized",
                {
                    "by": compactor.name,
                    "through": update.get("through"),
                    "tokens_before": before,
                    "tokens_after": after,
                    "pinned_keys": update.get("pin_keys", []),
                    "identifiers": update.get("identifiers", []),
                },
            )

    def _act(self, run: _Run, step: StepBuffer, calls: list[ToolCall]) -> None:
        """The turn's tool calls, their results appended in the model's order. When the executor allows it
        (:meth:`CallRunner.can_overlap`) up to ``tool_calls_at_once`` calls are under way together: each is begun in
        the model's order — its checks, an approval request — and they are collected in that order. Beginning stops
        at a call that waits for an approval (it and the calls after it wait, as one after another) or is rejected
        with ``stop_on_rejection``, and at a guard's stop (the calls begun before it are collected first)."""
        width = max(1, self.config.tool_calls_at_once) if len(calls) > 1 and self.calls.can_overlap() else 1
        begun: dict[int, Begun] = {}
        ahead = 0  # the next call to begin
        held: StopRun | None = None  # a guard's stop, met while beginning ahead
        hold = False  # a begun call holds back the rest (an approval wait, a rejection that stops the run)
        pending: list[ToolCall] = []
        for index, call in enumerate(calls):
            if width == 1:
                self.calls.check_guards(step, None, self._elapsed(run))
                outcome = self.calls.call_tool(run.run_id, step, call)
            else:
                while not hold and held is None and ahead < min(len(calls), index + width):
                    try:
                        self.calls.check_guards(step, None, self._elapsed(run))
                    except StopRun as exc:
                        held = exc
                        break
                    begun[ahead] = self.calls.start_tool(run.run_id, step, calls[ahead])
                    settled = begun[ahead].settled()
                    hold = settled is not None and (settled.pending or self._stops_run(settled))
                    ahead += 1
                if index not in begun:
                    assert held is not None, "a call was neither begun nor held back"
                    raise held
                outcome = self.calls.finish_tool(run.run_id, step, begun.pop(index))
            if outcome.pending:
                pending = calls[index:]
                self._finish_begun(run, step, begun)
                break
            step.appended.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": outcome.content})
            failed = outcome.status in FAILED_TOOL_STATUSES
            step.state[TOOL_FAILURE_STREAK] = int(step.state.get(TOOL_FAILURE_STREAK, 0)) + 1 if failed else 0
            if self._stops_run(outcome):
                self._finish_begun(run, step, begun)
                message = f"The action {call.name} was not approved, so I did not carry it out and stopped here."
                raise StopRun(Stop(TerminalReason.REJECTED, message, f"tool call {call.name} was rejected by an approver"))
        if pending:
            step.pending = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in pending]
            step.transition(Phase.WAITING, f"tool call {pending[0].name} waits for approval")
            return
        step.transition(Phase.OBSERVING, "tool results observed")

    def _stops_run(self, outcome: ToolOutcome) -> bool:
        return outcome.status == ToolStatus.REJECTED and self.config.stop_on_rejection

    def _finish_begun(self, run: _Run, step: StepBuffer, begun: dict[int, Begun]) -> None:
        """Calls begun past the one that ends the turn (only one that was not settled when begun can, and only an
        executor breaking its word would give one): collected, so each ends and leaves its audit row and trace."""
        for index in sorted(begun):
            self.calls.finish_tool(run.run_id, step, begun.pop(index))

    def _call_model(self, run: _Run, step: StepBuffer, request: ModelRequest) -> ModelResponse:
        return self.calls.call_model(run.run_id, step, request, lambda: self._elapsed(run))

    # -- hooks and ending -----------------------------------------------------------------

    def _run_hooks(self, run: _Run, step: StepBuffer, position: HookPosition, *, response: ModelResponse | None = None) -> None:
        for hook in self.hooks:
            if position not in hook.positions:
                continue
            ctx = HookContext(
                run_id=run.run_id,
                step=step.number,
                position=position,
                state=MappingProxyType(copy_json(step.state)),
                messages=tuple(dict(m) for m in run.checkpoint.messages + step.appended),
                usage=step.usage,
                elapsed_seconds=self._elapsed(run),
                response=response,
                terminal_reason=step.terminal_reason,
            )
            try:
                result = hook(ctx)
            except StateError:
                raise
            except Exception as exc:
                log.exception("hook %s failed at %s for run %s", hook.name, position.value, run.run_id)
                raise StopRun(Stop(TerminalReason.ERROR, None, f"hook {hook.name!r} failed at {position.value}: {exc}", hook.name)) from exc
            if result is None:
                continue
            check_result(hook, position, result)
            step.state = self.schema.merge(step.state, result.updates, source=f"hook {hook.name!r} at {position.value}")
            jump = result.jump_to if position != HookPosition.AFTER_AGENT else None
            step.emit(
                "hook.decision",
                {
                    "hook": hook.name,
                    "position": position.value,
                    "updates": sorted(result.updates),
                    "jump_to": jump,
                    "reason": result.reason,
                },
            )
            if jump == END:
                reason = result.reason or f"hook {hook.name!r} ended the run"
                raise StopRun(Stop(result.terminal_reason, result.message, reason, hook.name))

    def _end(self, run: _Run, step: StepBuffer, stop: Stop) -> None:
        """Finish the run with exactly one terminal reason; a second decision is ignored."""
        if step.finished:
            return
        stubs = open_call_stubs(run.checkpoint.messages + step.appended, stop.reason)
        step.appended.extend(stubs)
        step.pending = []
        if stop.message is not None and stop.terminal != TerminalReason.FINAL_ANSWER:
            step.appended.append({"role": "assistant", "content": stop.message})
        step.terminal_reason = stop.terminal
        step.output = stop.message
        step.transition(Phase.FINISHED, stop.reason or stop.terminal.value)
        step.emit(
            "run.finished",
            {
                "terminal_reason": stop.terminal.value,
                "output": stop.message,
                "reason": stop.reason or stop.terminal.value,
                "decided_by": stop.source or None,
                "usage": step.usage.to_dict(),
                "model_calls": step.state.get(LLM_CALL_COUNT),
                "steps": step.number,
                "wall_seconds": round(self._elapsed(run), 3),
            },
        )
        try:
            self._run_hooks(run, step, HookPosition.AFTER_AGENT)
        except (StopRun, StateError) as exc:  # the outcome is decided; a failing after_agent hook is only reported
            step.emit("hook.error", {"position": HookPosition.AFTER_AGENT.value, "error": str(exc)})

    def _max_recursion_reason(self) -> str:
        return f"hard step cap: {self.config.max_recursion} steps (max_recursion) reached without a final answer"

    def _max_recursion_message(self) -> str:
        return (
            f"I stopped after {self.config.max_recursion} steps without reaching an answer. "
            "Please narrow the request or contact an operator."
        )

    def _elapsed(self, run: _Run) -> float:
        return run.base_seconds + (self.clock() - run.segment_start)

    def _commit(self, run: _Run, step: StepBuffer) -> StepAck:
        """Commit the step and advance the in-memory checkpoint to match what is now durable."""
        checkpoint = run.checkpoint
        step.state[ACTIVE_SECONDS] = round(self._elapsed(run), 3)
        if step.terminal_reason is not None:
            step.state[TERMINAL_REASON] = step.terminal_reason.value
            step.state[OUTPUT] = step.output
        record = StepRecord(
            step=step.number,
            phase=step.phase,
            appended_messages=step.appended,
            state=dict(step.state),
            usage=step.usage,
            events=step.events,
            pending_calls=step.pending,
            terminal_reason=step.terminal_reason,
            output=step.output,
        )
        ack = self.store.commit_step(run.run_id, record)
        checkpoint.step = step.number
        checkpoint.phase = step.phase
        checkpoint.messages.extend(step.appended)
        checkpoint.state = step.state
        checkpoint.usage = step.usage
        checkpoint.pending_calls = step.pending
        checkpoint.cancel_requested = False
        if self.sink is not None:
            try:
                self.sink.publish(run.run_id, step.events)
            except Exception:  # live delivery is best effort; the events are committed
                log.exception("event sink failed for run %s", run.run_id)
        return ack
