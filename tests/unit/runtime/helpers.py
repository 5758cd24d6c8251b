"""Shared builders for the runtime tests: a run in an in-memory store, driven by a scripted model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.config import Runtime, build_runtime, parse_policy
from runtime.loop import AgentConfig, AgentLoop, LoopResult
from runtime.memory import FunctionToolExecutor, InMemoryRunStore, ToolFunction
from runtime.protocols import Checkpoint, StepRecord
from runtime.scripted import Reply, ScriptedModel
from runtime.types import TerminalReason, ToolSpec

MODEL = "test-model"  # no bundled encoding: tokens are estimated by characters (deterministic, fast)


def lookup(args: dict[str, Any]) -> str:
    return f"found {args}"


def tool_spec(name: str) -> ToolSpec:
    return ToolSpec(name, f"The {name} tool.", {"type": "object", "properties": {}})


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Harness:
    loop: AgentLoop
    store: InMemoryRunStore
    model: ScriptedModel
    executor: FunctionToolExecutor
    run_id: str = "run-1"
    clock: FakeClock = field(default_factory=FakeClock)

    def run(self) -> LoopResult:
        return self.loop.run(self.run_id)

    def records(self) -> list[StepRecord]:
        return self.store.records(self.run_id)

    def events(self, type_: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.store.events(self.run_id) if type_ is None or e["type"] == type_]

    def messages(self) -> list[dict[str, Any]]:
        return self.store.load(self.run_id).messages

    def state(self) -> dict[str, Any]:
        return self.store.load(self.run_id).state

    def terminal_reasons(self) -> list[TerminalReason]:
        return [r.terminal_reason for r in self.records() if r.terminal_reason is not None]


def initial_checkpoint(user: str = "What is the status of flight CA1234?", state: Mapping[str, Any] | None = None) -> Checkpoint:
    return Checkpoint(
        messages=[{"role": "system", "content": "You are a travel assistant."}, {"role": "user", "content": user}],
        state=dict(state or {}),
    )


def harness(
    replies: Sequence[Reply],
    *,
    policy: Mapping[str, Any] | None = None,
    functions: Mapping[str, ToolFunction] | None = None,
    needs_approval: frozenset[str] = frozenset(),
    state: Mapping[str, Any] | None = None,
    config: AgentConfig | None = None,
    store: InMemoryRunStore | None = None,
    measure_usage: bool = False,
    extra: Callable[[Runtime], None] | None = None,
    **loop_kwargs: Any,
) -> Harness:
    functions = dict(functions or {"lookup": lookup})
    store = store or InMemoryRunStore()
    store.create("run-1", initial_checkpoint(state=state))
    model = ScriptedModel(list(replies), measure_usage=measure_usage)
    executor = FunctionToolExecutor(functions, needs_approval=needs_approval)
    base = config or AgentConfig(MODEL, "You are a travel assistant.", [tool_spec(n) for n in functions])
    runtime = build_runtime(parse_policy(dict(policy or {})), base)
    if extra is not None:
        extra(runtime)
    clock = FakeClock()
    loop = AgentLoop(
        runtime.config,
        model,
        executor,
        store,
        hooks=loop_kwargs.pop("hooks", runtime.hooks),
        model_interceptors=loop_kwargs.pop("model_interceptors", runtime.model_interceptors),
        tool_interceptors=loop_kwargs.pop("tool_interceptors", runtime.tool_interceptors),
        guards=runtime.guards,
        compactors=runtime.compactors,
        state_schema=runtime.state_schema,
        clock=loop_kwargs.pop("clock", clock),
        **loop_kwargs,
    )
    return Harness(loop, store, model, executor, clock=clock)
