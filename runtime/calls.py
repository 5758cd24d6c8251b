"""Making one model call or one tool call: interceptors, guards, pricing, and the call's events."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from runtime.budgets import CallGuard, GuardContext, Stop, estimate_request, price
from runtime.interceptors import ModelInterceptor, ToolInterceptor, chain_model, chain_tool
from runtime.protocols import ModelClient, PendingTool, ToolExecutor
from runtime.step import StepBuffer, StopRun
from runtime.types import (
    ModelRequest,
    ModelResponse,
    TerminalReason,
    ToolCall,
    ToolContext,
    ToolOutcome,
    ToolStatus,
    Usage,
    new_span_id,
)

if TYPE_CHECKING:
    from runtime.loop import AgentConfig

log = logging.getLogger(__name__)


class CallRunner:
    def __init__(
        self,
        config: AgentConfig,
        model: ModelClient,
        tools: ToolExecutor,
        *,
        model_interceptors: Sequence[ModelInterceptor],
        tool_interceptors: Sequence[ToolInterceptor],
        guards: Sequence[CallGuard],
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.model = model
        self.tools = tools
        self.model_interceptors = list(model_interceptors)
        self.tool_interceptors = list(tool_interceptors)
        self.guards = list(guards)
        self.clock = clock

    def check_guards(self, step: StepBuffer, request: ModelRequest | None, elapsed: float) -> None:
        ctx = GuardContext(
            step.usage,
            MappingProxyType(step.state),
            elapsed,
            self.config.input_price_per_million,
            self.config.output_price_per_million,
            self.config.max_output_tokens,
        )
        for guard in self.guards:
            stop = guard.check(request, ctx)
            if stop is not None:
                raise StopRun(stop)

    def call_model(self, run_id: str, step: StepBuffer, request: ModelRequest, elapsed: Callable[[], float]) -> ModelResponse:
        """One model call through the interceptors, with the guards checked on the final request."""
        span = new_span_id()
        stops: list[StopRun] = []
        estimated_in, _ = estimate_request(request, self.config.max_output_tokens)

        def guarded(final: ModelRequest) -> ModelResponse:
            try:
                self.check_guards(step, final, elapsed())
            except StopRun as stop:
                stops.append(stop)  # kept even if an interceptor swallows the exception
                raise
            reply = self.model.complete(final)
            # A private copy: interceptors may annotate it, and a client may hand out shared objects.
            return replace(reply, tool_calls=list(reply.tool_calls), trace=list(reply.trace))

        started = self.clock()
        try:
            response = chain_model(self.model_interceptors, guarded)(request)
        except Exception as exc:
            if stops:
                raise stops[0] from None
            log.warning("model call failed for run %s: %s", run_id, exc)
            # A gateway error carries the attempts it made (provider, outcome, status): they explain the failure.
            attempts = getattr(exc, "trace", None)
            for extra in attempts if isinstance(attempts, list) else []:
                if isinstance(extra, dict):
                    step.emit(str(extra.get("type", "model.attempt")), extra, parent=span)
            step.emit("model.error", {"model": request.model, "task": request.task, "error": str(exc)}, span_id=span)
            raise StopRun(Stop(TerminalReason.ERROR, None, f"{request.task} model call failed: {exc}")) from exc
        if stops:
            raise stops[0]
        latency_ms = round((self.clock() - started) * 1000, 1)
        usage = response.usage
        if usage.cost == 0 and (self.config.input_price_per_million or self.config.output_price_per_million):
            cost = price(
                usage.input_tokens,
                usage.output_tokens,
                self.config.input_price_per_million,
                self.config.output_price_per_million,
            )
            usage = response.usage = Usage(usage.input_tokens, usage.output_tokens, cost)
        step.usage = step.usage + usage
        for extra in response.trace:
            step.emit(str(extra.get("type", "model.attempt")), extra, parent=span)
        step.emit(
            "model.call",
            {
                "model": response.model,
                "task": request.task,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "estimated_input_tokens": estimated_in,
                "cost": usage.cost,
                "latency_ms": latency_ms,
                "finish_reason": response.finish_reason,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls],
                "content": response.content,
                "messages_in": len(request.messages),
            },
            span_id=span,
        )
        return response

    def call_tool(self, run_id: str, step: StepBuffer, call: ToolCall) -> ToolOutcome:
        span = new_span_id()
        started = self.clock()
        try:
            outcome = chain_tool(self.tool_interceptors, self.tools.execute)(
                call, ToolContext(run_id=run_id, step=step.number, span_id=span)
            )
        except Exception as exc:  # an executor must not raise; if it does, the model still gets an answer
            outcome = self._raised(run_id, call, exc)
        self._emit(step, call, span, started, outcome)
        return outcome

    def can_overlap(self) -> bool:
        """Whether a turn's calls may run side by side: the executor can begin a call and answer later, and no tool
        interceptor wraps the calls (an interceptor sees one whole call at a time)."""
        return not self.tool_interceptors and callable(getattr(self.tools, "start", None))

    def start_tool(self, run_id: str, step: StepBuffer, call: ToolCall) -> Begun:
        """Begin a call (:meth:`can_overlap`); :meth:`finish_tool` collects it."""
        span = new_span_id()
        started = self.clock()
        try:
            pending: Any = self.tools.start(call, ToolContext(run_id=run_id, step=step.number, span_id=span))  # type: ignore[attr-defined]
        except Exception as exc:
            pending = _Decided(self._raised(run_id, call, exc))
        return Begun(call, span, started, pending)

    def finish_tool(self, run_id: str, step: StepBuffer, begun: Begun) -> ToolOutcome:
        try:
            outcome = begun.pending.result()
        except Exception as exc:
            outcome = self._raised(run_id, begun.call, exc)
        self._emit(step, begun.call, begun.span, begun.started, outcome)
        return outcome

    def _raised(self, run_id: str, call: ToolCall, exc: Exception) -> ToolOutcome:
        log.exception("tool executor raised for run %s call %s", run_id, call.id)
        return ToolOutcome(call.id, ToolStatus.ERROR, f"The tool {call.name} failed unexpectedly: {exc}")

    def _emit(self, step: StepBuffer, call: ToolCall, span: str, started: float, outcome: ToolOutcome) -> None:
        for extra in outcome.trace:
            step.emit(str(extra.get("type", "tool.stage")), extra, parent=span)
        step.emit(
            "tool.call",
            {
                "tool": call.name,
                "call_id": call.id,
                "status": outcome.status.value,
                "result": outcome.content[:2000],
                "latency_ms": round((self.clock() - started) * 1000, 1),
            },
            span_id=span,
        )


@dataclass
class Begun:
    """A call :meth:`CallRunner.start_tool` began."""

    call: ToolCall
    span: str
    started: float
    pending: PendingTool

    def settled(self) -> ToolOutcome | None:
        try:
            return self.pending.settled()
        except Exception:  # result() will say what went wrong
            return None


class _Decided:
    """A call that could not begin: its outcome is known."""

    def __init__(self, outcome: ToolOutcome) -> None:
        self.outcome = outcome

    def settled(self) -> ToolOutcome | None:
        return self.outcome

    def result(self) -> ToolOutcome:
        return self.outcome
