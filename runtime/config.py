"""The per-agent-version runtime policy: one JSON document, validated when the version is saved.

Shape (every section and field is optional; missing ones take :data:`DEFAULT_POLICY`'s value;
``null`` switches a single limit off)::

    {
      "version": 1,
      "state": {"strategies": {"visited": "append"}},          # merge strategy per business key
      "limits": {
        "max_recursion": 10,                                      # hard step cap (stop layer 3)
        "model_calls": {"run_limit": 8, "thread_limit": null,     # agent model calls per run / session
                        "exit_behavior": "end", "message": null}, # "end" -> limit_reached, "error" -> error
        "tiers": {"enabled": false, "table": {"free": 3, "vip": 10},   # model calls by state["user_tier"]
                  "default_tier": null, "scope": "run", "exit_behavior": "end", "message": null}
      },
      "budgets": {
        "max_output_tokens": 1024,                                # assumed per call when projecting
        "run": {"tokens": null, "cost": null, "wall_seconds": 300},
        "session": {"tokens": null, "cost": null, "wall_seconds": null}
      },
      "loop_detection": {"enabled": true, "max_repeats": 3, "max_consecutive_failures": 3, "message": null},
      "context": {
        "context_window": null,                                   # null: the model's (AgentConfig.context_window)
        "summarization": {"enabled": false, "token_threshold": 6000, "keep_last": 6,
                          "model": null, "max_summary_tokens": 512},
        "editing": {"enabled": false, "trigger": 12000, "keep": 6000, "clear_at_least": 0, "exclude_tools": []},
        "compression": {"enabled": true, "window_share": 0.7, "keep_last": 6, "pin_state_keys": [],
                        "extract_identifiers": true, "identifier_patterns": [...],
                        "model": null, "max_summary_tokens": 512}
      },
      "approvals": {"stop_on_rejection": false, "tools": {}},
      "input_masking": {"raw": ["phone"]},     # personal data kept raw in run input (audited opt-in)
      "model": {"fallbacks": ["backup/gpt-4o-mini", "demo/planner"],     # tried in order after the
                "task_models": {"summarize": "openai/gpt-4o-mini"}},      # version's model; per task class
      "hooks": [{"name": "flag", "kind": "set_state", "position": "before_agent", "values": {"vip_path": true}},
                {"name": "escalated", "kind": "stop_when", "key": "escalated", "equals": true, "message": "..."},
                {"name": "pii", "kind": "acme.redact_pii", "config": {"mask": "***"}}],     # an installed extension
      "interceptors": {"model": [{"kind": "acme.tag_request", "config": {}}],               # wrap every model call
                       "tool": [{"kind": "acme.trim_result", "config": {"max_chars": 2000}}]}  # and every tool call
    }

Hook and interceptor kinds come from one table (:mod:`runtime.plugins`): the built-in hook kinds
and the classes installed packages contribute through entry points, as far as the platform allows them.
An entry naming a contributed kind has ``kind`` and ``config`` (checked against the class's config model)
and, for a hook, ``name``. The table is ``extensions=`` of :func:`check_policy`, :func:`parse_policy` and
:func:`build_runtime`, by default the process-wide :func:`~runtime.plugins.default_registry`.

Session inputs the Django side puts in the initial ``Checkpoint.state``: ``session_model_calls``
(int) and ``session_usage`` (``{"input_tokens", "output_tokens", "cost", "wall_seconds"}``) of the
session's earlier runs, and ``user_tier``. Prices and the context window come from
:class:`~runtime.loop.AgentConfig` (the model gateway's price table).

:func:`parse_policy` reports every problem at once, each naming the field path, what was wrong
and what is expected; :func:`build_runtime` turns a parsed policy into the loop's parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.budgets import BudgetGuard, BudgetLimits, CallGuard
from runtime.compaction import Compactor, Compression, ContextEditing, Summarization
from runtime.documents import DocumentError, problems, type_name
from runtime.hooks import Hook
from runtime.interceptors import ModelInterceptor, ToolInterceptor
from runtime.limits import LoopDetection, ModelCallLimit, TierLimit
from runtime.loop import AgentConfig, AgentLoop
from runtime.plugins import ExtensionRegistry, default_registry
from runtime.policy_document import BUILTIN_HOOK_NAMES as BUILTIN_HOOK_NAMES
from runtime.policy_document import RAW_INPUT_PATTERNS, Budget, Policy
from runtime.protocols import EventSink, ModelClient, RunStore, ToolExecutor
from runtime.state import StateSchema, parse_strategies

#: The documented default document: every field of :class:`~runtime.policy_document.Policy` at its default.
DEFAULT_POLICY: dict[str, Any] = Policy().to_json()


class PolicyError(DocumentError):
    """The policy is invalid; ``errors`` lists every problem as ``path: what is wrong``."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__(errors, "runtime policy")


@dataclass(frozen=True)
class RuntimePolicy:
    """A validated policy: ``policy`` is the typed document (frozen), ``document`` the complete JSON to store."""

    policy: Policy

    @property
    def document(self) -> dict[str, Any]:
        return self.policy.to_json()


def check_policy(data: Any, *, extensions: ExtensionRegistry | None = None) -> list[str]:
    """Every problem of a policy document (empty list: valid). Hook and interceptor kinds are looked up in
    ``extensions`` (default: the process-wide table)."""
    return _parse(data, extensions)[1]


def _parse(data: Any, extensions: ExtensionRegistry | None) -> tuple[Policy | None, list[str]]:
    if not isinstance(data, dict):
        return None, [f"policy: must be a JSON object, got {type_name(data)}"]
    return problems(Policy, data, context={"extensions": default_registry() if extensions is None else extensions})


def raw_input_patterns(policy: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The personal-data patterns a version keeps raw in its run input (``input_masking.raw``); none by default."""
    raw = ((policy or {}).get("input_masking") or {}).get("raw") or []
    return tuple(str(name) for name in raw if name in RAW_INPUT_PATTERNS)


def parse_policy(data: Any, *, extensions: ExtensionRegistry | None = None) -> RuntimePolicy:
    """Validate a policy document; raise :class:`PolicyError` listing every problem."""
    policy, errors = _parse(data, extensions)
    if errors or policy is None:
        raise PolicyError(errors)
    return RuntimePolicy(policy)


@dataclass
class Runtime:
    """The loop's parts for one agent version. ``loop(...)`` builds an :class:`AgentLoop`."""

    config: AgentConfig
    hooks: list[Hook] = field(default_factory=list)
    model_interceptors: list[ModelInterceptor] = field(default_factory=list)
    tool_interceptors: list[ToolInterceptor] = field(default_factory=list)
    guards: list[CallGuard] = field(default_factory=list)
    compactors: list[Compactor] = field(default_factory=list)
    state_schema: StateSchema = field(default_factory=StateSchema)

    def loop(self, model: ModelClient, tools: ToolExecutor, store: RunStore, *, sink: EventSink | None = None) -> AgentLoop:
        return AgentLoop(
            self.config,
            model,
            tools,
            store,
            hooks=self.hooks,
            model_interceptors=self.model_interceptors,
            tool_interceptors=self.tool_interceptors,
            guards=self.guards,
            compactors=self.compactors,
            state_schema=self.state_schema,
            sink=sink,
        )


def build_runtime(
    policy: RuntimePolicy,
    config: AgentConfig,
    *,
    extensions: ExtensionRegistry | None = None,
    extra_hooks: Sequence[Hook] = (),
    model_interceptors: Sequence[ModelInterceptor] = (),
    tool_interceptors: Sequence[ToolInterceptor] = (),
) -> Runtime:
    """``config`` carries model, prompt, tools, prices and window; the policy fills in the rest.

    The policy's hooks and interceptors are instantiated from ``extensions`` (default: the process-wide
    table; raises :class:`~runtime.plugins.ExtensionError` if one cannot be built). Order: the
    built-ins, then the policy's, then the extra Python hooks/interceptors (custom code); the first model
    interceptor is the outermost, so the policy's see the request after context editing and compression."""
    table = default_registry() if extensions is None else extensions
    doc = policy.policy
    limits, budgets, ctx = doc.limits, doc.budgets, doc.context
    window = ctx.context_window or config.context_window
    config = replace(
        config,
        max_recursion=limits.max_recursion,
        max_output_tokens=budgets.max_output_tokens,
        context_window=window,
        stop_on_rejection=doc.approvals.stop_on_rejection,
    )
    mc, tiers, ld = limits.model_calls, limits.tiers, doc.loop_detection
    hooks: list[Hook] = [ModelCallLimit(mc.run_limit, mc.thread_limit, mc.exit_behavior, mc.message)]
    if tiers.enabled:
        hooks.append(TierLimit(dict(tiers.table), tiers.default_tier, tiers.scope, tiers.exit_behavior, tiers.message))
    if ld.enabled:
        hooks.append(LoopDetection(ld.max_repeats, ld.max_consecutive_failures, ld.message))
    hooks += table.build_hooks(doc.hooks)
    hooks += extra_hooks
    guards: list[CallGuard] = [BudgetGuard(_limits(budgets.run), _limits(budgets.session))]
    s, e, p = ctx.summarization, ctx.editing, ctx.compression
    compactors: list[Compactor] = []
    interceptors: list[ModelInterceptor] = []
    if s.enabled:
        compactors.append(Summarization(s.token_threshold, s.keep_last, s.model, s.max_summary_tokens))
    if e.enabled:
        interceptors.append(ContextEditing(e.trigger, e.keep, e.clear_at_least, frozenset(e.exclude_tools)))
    if p.enabled:
        compression = Compression(
            context_window=window,
            window_share=float(p.window_share),
            keep_last=p.keep_last,
            pin_keys=tuple(p.pin_state_keys),
            identifier_patterns=tuple(p.identifier_patterns) if p.extract_identifiers else (),
            model=p.model,
            max_summary_tokens=p.max_summary_tokens,
            exclude_tools=frozenset(e.exclude_tools) if e.enabled else frozenset(),
        )
        compactors.append(compression)
        interceptors.append(compression)
    schema, _ = parse_strategies(doc.state.strategies, path="state.strategies")
    interceptors += table.build_model_interceptors(doc.interceptors.model)
    tool_chain = [*table.build_tool_interceptors(doc.interceptors.tool), *tool_interceptors]
    return Runtime(config, hooks, interceptors + list(model_interceptors), tool_chain, guards, compactors, schema)


def _limits(budget: Budget) -> BudgetLimits:
    return BudgetLimits(budget.tokens, budget.cost, budget.wall_seconds)
