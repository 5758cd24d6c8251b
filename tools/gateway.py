"""The tool gateway: every tool call of every run goes through this one pipeline.

resolve → authorize → validate → duplicate guard → approval gate → execute → shape → audit.
Each stage leaves an entry in the trace; each call leaves exactly one audit row. Whatever
goes wrong becomes a ToolOutcome the model can read, never an exception into the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from agents.runtime.types import ToolCall, ToolContext, ToolOutcome, ToolStatus
from audit.masking import summarize_arguments
from audit.models import ToolCallAudit
from tools.arguments import arguments_hash, parse_arguments
from tools.models import Tool, ToolCategory, ToolKind
from tools.shaping import shape_result

#: At most this many calls of one tool run at once in a process (a bulkhead per tool).
BULKHEAD_SIZE = 4
_bulkheads: dict[str, threading.BoundedSemaphore] = {}
_bulkheads_lock = threading.Lock()
_executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="tool")


def _bulkhead(key: str) -> threading.BoundedSemaphore:
    with _bulkheads_lock:
        return _bulkheads.setdefault(key, threading.BoundedSemaphore(BULKHEAD_SIZE))


@dataclass
class _Call:
    call: ToolCall
    ctx: ToolContext
    started: float = field(default_factory=time.perf_counter)
    trace: list[dict[str, Any]] = field(default_factory=list)
    tool: Tool | None = None
    arguments: dict[str, Any] = field(default_factory=dict)

    def stage(self, name: str, ok: bool, **details: Any) -> None:
        self.trace.append({"type": "tool.stage", "stage": name, "ok": ok, **details})


class ToolGateway:
    """Implements ``agents.runtime.protocols.ToolExecutor`` for one run."""

    def __init__(self, *, run: Any, tools: list[Tool], audit_buffer: list[Any]) -> None:
        self.run = run
        self.tools = {t.name: t for t in tools}
        self.audit_buffer = audit_buffer
        self.whitelist = {n for n in run.version.tools if isinstance(n, str)}

    # -- the pipeline ---------------------------------------------------------------------

    def execute(self, call: ToolCall, ctx: ToolContext) -> ToolOutcome:
        state = _Call(call, ctx)
        for stage in (self._resolve, self._authorize, self._validate, self._execute):
            outcome = stage(state)
            if outcome is not None:
                return self._audit(state, outcome)
        raise AssertionError("the execute stage always returns an outcome")

    def _resolve(self, s: _Call) -> ToolOutcome | None:
        tool = self.tools.get(s.call.name)
        if tool is None:
            s.stage("resolve", False, reason="unknown tool")
            names = ", ".join(sorted(self.tools)) or "none"
            return self._fail(s, ToolStatus.DENIED, f"There is no tool named {s.call.name!r}. The tools you can call are: {names}.")
        if not tool.enabled:
            s.stage("resolve", False, reason="disabled by an operator")
            message = f"The tool {tool.name} is switched off by an operator. Do not retry it; tell the user it is unavailable."
            return self._fail(s, ToolStatus.DENIED, message)
        s.tool = tool
        s.stage("resolve", True, kind=tool.kind)
        return None

    def _authorize(self, s: _Call) -> ToolOutcome | None:
        if s.call.name not in self.whitelist:
            s.stage("authorize", False, reason="not in this agent version's tool list")
            return self._fail(s, ToolStatus.DENIED, f"This agent may not use the tool {s.call.name}. Do not retry it.")
        s.stage("authorize", True)
        return None

    def _validate(self, s: _Call) -> ToolOutcome | None:
        assert s.tool is not None
        parsed = parse_arguments(s.call.arguments, s.tool.parameters or {"type": "object", "properties": {}})
        if not parsed.ok:
            s.stage("validate", False, errors=[p.message for p in parsed.errors])
            return self._fail(s, ToolStatus.INVALID, parsed.model_message)
        s.arguments = parsed.arguments
        s.stage("validate", True, repaired=bool(parsed.repaired), mapped=[list(m) for m in parsed.mapped])
        return None

    def _execute(self, s: _Call) -> ToolOutcome:
        tool = s.tool
        assert tool is not None
        runner = self._runner(tool)
        with _bulkhead(f"{tool.tenant_id}:{tool.name}"):
            future = _executor.submit(runner, s.arguments)
            try:
                result = future.result(timeout=tool.timeout_seconds)
            except FutureTimeout:
                future.cancel()
                s.stage("execute", False, reason="timeout", timeout_seconds=tool.timeout_seconds)
                return self._fail(
                    s, ToolStatus.TIMEOUT,
                    f"No result was obtained from {tool.name} within {tool.timeout_seconds:g} s. "
                    "Do not tell the user it succeeded.",
                )
            except Exception as exc:
                s.stage("execute", False, reason=type(exc).__name__)
                return self._fail(s, ToolStatus.ERROR, f"The tool {tool.name} failed: {exc}")
        s.stage("execute", True)
        shaped = shape_result(
            result,
            field_whitelist=tool.result_fields or None,
            size_cap=tool.result_size_cap,
            summary_template=tool.summary_template or None,
        )
        s.stage("shape", True, truncated=shaped.truncated, original_size=shaped.original_size,
                missing_fields=shaped.missing_fields)
        return ToolOutcome(s.call.id, ToolStatus.OK, shaped.content, trace=s.trace)

    # -- helpers --------------------------------------------------------------------------

    def _runner(self, tool: Tool) -> Callable[[dict[str, Any]], Any]:
        if tool.kind == ToolKind.PYTHON:
            from tools.pyfunc import registry

            key = str(tool.config.get("function", ""))
            return lambda arguments: registry.call(key, arguments)
        raise NotImplementedError(f"tool kind {tool.kind} is not executable yet")

    def _fail(self, s: _Call, status: ToolStatus, message: str) -> ToolOutcome:
        return ToolOutcome(s.call.id, status, message, trace=s.trace)

    def _audit(self, s: _Call, outcome: ToolOutcome) -> ToolOutcome:
        tool = s.tool
        sensitive = set(tool.sensitive_fields or []) if tool is not None else set()
        run = self.run
        latency_ms = int((time.perf_counter() - s.started) * 1000)
        arguments = s.arguments if s.arguments else {"_raw": s.call.arguments[:500]}
        self.audit_buffer.append(
            ToolCallAudit(
                tenant_id=run.tenant_id, run_id=run.pk, agent_id=run.agent_id, version_id=run.version_id,
                session_id=run.session_id, user_id=run.created_by_id, api_key_id=run.api_key_id,
                step=s.ctx.step, call_id=s.call.id, span_id=s.ctx.span_id, tool_name=s.call.name[:200],
                arguments_summary=summarize_arguments(arguments, sensitive),
                arguments_hash=arguments_hash(arguments),
                status=outcome.status.value,
                error="" if outcome.status == ToolStatus.OK else outcome.content[:2000],
                latency_ms=latency_ms,
                result_size=len(outcome.content.encode()),
            )
        )
        outcome.trace.append({"type": "tool.audit", "status": outcome.status.value, "latency_ms": latency_ms,
                              "category": tool.category if tool is not None else ToolCategory.READ})
        return outcome
