"""Field-by-field checks of a runtime policy document (see :mod:`runtime.config` for its shape)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.approval_policy import policy_errors as approval_policy_errors
from runtime.plugins import ExtensionRegistry, Role
from runtime.state import parse_strategies

BUILTIN_HOOK_NAMES = ("model_call_limit", "tier_limit", "loop_detection", "budget")
_NOTHING = object()


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class Checker:
    """Collects every problem as ``path: what is wrong[, got value]``."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, problem: str, value: Any = _NOTHING) -> None:
        got = "" if value is _NOTHING else f", got {value!r}" if not isinstance(value, dict | list) else f", got {_type_name(value)}"
        self.errors.append(f"{path}: {problem}{got}")

    def fields(self, node: Any, path: str, defaults: Mapping[str, Any]) -> bool:
        if not isinstance(node, dict):
            self.fail(path, "must be an object", node)
            return False
        for key in node:
            if key not in defaults:
                self.fail(f"{path}.{key}", f"unknown field; expected one of {sorted(defaults)}")
        return True

    def integer(self, node: Mapping[str, Any], key: str, path: str, *, minimum: int = 1, nullable: bool = False) -> None:
        value = node.get(key)
        if value is None and nullable:
            return
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            self.fail(f"{path}.{key}", f"must be {kind}{' or null' if nullable else ''}", value)

    def number(self, node: Mapping[str, Any], key: str, path: str, *, nullable: bool = True, maximum: float | None = None) -> None:
        value = node.get(key)
        if value is None and nullable:
            return
        wrong = isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
        if wrong or (maximum is not None and isinstance(value, int | float) and value > maximum):
            upper = f" and at most {maximum}" if maximum is not None else ""
            self.fail(f"{path}.{key}", f"must be a number above 0{upper}{' or null' if nullable else ''}", value)

    def choice(self, node: Mapping[str, Any], key: str, path: str, options: Sequence[str]) -> None:
        if node.get(key) not in options:
            self.fail(f"{path}.{key}", f"must be one of {list(options)}", node.get(key))

    def boolean(self, node: Mapping[str, Any], key: str, path: str) -> None:
        if not isinstance(node.get(key), bool):
            self.fail(f"{path}.{key}", "must be true or false", node.get(key))

    def text(self, node: Mapping[str, Any], key: str, path: str) -> None:
        value = node.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            self.fail(f"{path}.{key}", "must be a non-empty string or null", value)

    def strings(self, node: Mapping[str, Any], key: str, path: str) -> None:
        value = node.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.fail(f"{path}.{key}", "must be a list of non-empty strings", value)


def check_document(c: Checker, doc: dict[str, Any], d: dict[str, Any], extensions: ExtensionRegistry) -> None:
    """Check a document merged over the defaults ``d``; problems go to ``c.errors``. Hooks and interceptors
    name kinds of ``extensions`` (the built-in and installed ones the platform allows)."""
    if c.fields(doc["state"], "state", d["state"]):
        strategies = doc["state"].get("strategies")
        if isinstance(strategies, dict):
            c.errors += parse_strategies(strategies, path="state.strategies")[1]
        else:
            c.fail("state.strategies", "must be an object of key -> 'append'|'replace'", strategies)
    limits = doc["limits"]
    if c.fields(limits, "limits", d["limits"]):
        c.integer(limits, "max_recursion", "limits")
        mc = limits["model_calls"]
        if c.fields(mc, "limits.model_calls", d["limits"]["model_calls"]):
            c.integer(mc, "run_limit", "limits.model_calls", nullable=True)
            c.integer(mc, "thread_limit", "limits.model_calls", nullable=True)
            c.choice(mc, "exit_behavior", "limits.model_calls", ["end", "error"])
            c.text(mc, "message", "limits.model_calls")
        _check_tiers(c, limits["tiers"], d["limits"]["tiers"])
    _check_budgets(c, doc["budgets"], d["budgets"])
    ld = doc["loop_detection"]
    if c.fields(ld, "loop_detection", d["loop_detection"]):
        c.boolean(ld, "enabled", "loop_detection")
        c.integer(ld, "max_repeats", "loop_detection", minimum=2, nullable=True)
        c.integer(ld, "max_consecutive_failures", "loop_detection", nullable=True)
        c.text(ld, "message", "loop_detection")
    _check_context(c, doc["context"], d["context"])
    if c.fields(doc["approvals"], "approvals", d["approvals"]):
        c.boolean(doc["approvals"], "stop_on_rejection", "approvals")
        overrides = doc["approvals"]["tools"]
        # Per-tool approval policies; whether one is looser than the tool's own (its floor) needs the tools: agents.services.
        if not isinstance(overrides, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in overrides.items()):
            c.fail("approvals.tools", 'must map tool names to approval policies, e.g. {"refund_order": {"mode": "always"}}', overrides)
        else:
            for name, entry in overrides.items():
                c.errors += approval_policy_errors(entry, path=f"approvals.tools.{name}", allow_override=True)
    c.errors += extensions.check_entries(Role.HOOK, doc["hooks"], path="hooks", reserved=BUILTIN_HOOK_NAMES)
    if c.fields(doc["interceptors"], "interceptors", d["interceptors"]):
        c.errors += extensions.check_entries(Role.MODEL_INTERCEPTOR, doc["interceptors"]["model"], path="interceptors.model")
        c.errors += extensions.check_entries(Role.TOOL_INTERCEPTOR, doc["interceptors"]["tool"], path="interceptors.tool")
    _check_model(c, doc["model"], d["model"])


MODEL_TASKS = ("act", "summarize")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.:@/-]+$")


def _check_model(c: Checker, node: Any, defaults: dict[str, Any]) -> None:
    """Routing for the model gateway: fallbacks after the version's model, and a model per task class."""
    if not c.fields(node, "model", defaults):
        return
    fallbacks = node.get("fallbacks")
    if not isinstance(fallbacks, list):
        c.fail("model.fallbacks", 'must be a list of "provider/model" names', fallbacks)
    else:
        for index, name in enumerate(fallbacks):
            if not isinstance(name, str) or not _MODEL_NAME.match(name):
                c.fail(f"model.fallbacks[{index}]", 'must be "provider/model", e.g. "openai/gpt-4o-mini"', name)
    tasks = node.get("task_models")
    if not isinstance(tasks, dict):
        c.fail("model.task_models", f'must be an object of task -> "provider/model" (tasks: {list(MODEL_TASKS)})', tasks)
        return
    for task, name in tasks.items():
        if task not in MODEL_TASKS:
            c.fail(f"model.task_models.{task}", f"unknown task class; expected one of {list(MODEL_TASKS)}")
        elif not isinstance(name, str) or not _MODEL_NAME.match(name):
            c.fail(f"model.task_models.{task}", 'must be "provider/model", e.g. "openai/gpt-4o-mini"', name)


def _check_tiers(c: Checker, tiers: Any, defaults: dict[str, Any]) -> None:
    path = "limits.tiers"
    if not c.fields(tiers, path, defaults):
        return
    c.boolean(tiers, "enabled", path)
    c.choice(tiers, "scope", path, ["run", "session"])
    c.choice(tiers, "exit_behavior", path, ["end", "error"])
    c.text(tiers, "message", path)
    table = tiers.get("table")
    if not isinstance(table, dict):
        c.fail(f"{path}.table", 'must be an object of tier -> model-call limit, e.g. {"free": 3, "vip": 10}', table)
        return
    for tier in table:
        c.integer(table, tier, f"{path}.table")
    if tiers.get("enabled") is True and not table:
        c.fail(f"{path}.table", "must list at least one tier when the tier limit is enabled")
    default = tiers.get("default_tier")
    if default is not None and default not in table:
        c.fail(f"{path}.default_tier", f"must be null or one of the tiers in the table {sorted(table)}", default)


def _check_budgets(c: Checker, budgets: Any, defaults: dict[str, Any]) -> None:
    if not c.fields(budgets, "budgets", defaults):
        return
    c.integer(budgets, "max_output_tokens", "budgets")
    for scope in ("run", "session"):
        node = budgets[scope]
        if c.fields(node, f"budgets.{scope}", defaults[scope]):
            c.integer(node, "tokens", f"budgets.{scope}", nullable=True)
            c.number(node, "cost", f"budgets.{scope}")
            c.number(node, "wall_seconds", f"budgets.{scope}")
            tokens, out = node.get("tokens"), budgets.get("max_output_tokens")
            if isinstance(tokens, int) and isinstance(out, int) and 0 < tokens < out:
                c.fail(
                    f"budgets.{scope}.tokens",
                    f"must be at least budgets.max_output_tokens ({out}) or no call fits",
                    tokens,
                )


def _check_context(c: Checker, ctx: Any, defaults: dict[str, Any]) -> None:
    if not c.fields(ctx, "context", defaults):
        return
    c.integer(ctx, "context_window", "context", nullable=True)
    s, e, p = ctx["summarization"], ctx["editing"], ctx["compression"]
    if c.fields(s, "context.summarization", defaults["summarization"]):
        c.boolean(s, "enabled", "context.summarization")
        for key in ("token_threshold", "keep_last", "max_summary_tokens"):
            c.integer(s, key, "context.summarization")
        c.text(s, "model", "context.summarization")
    if c.fields(e, "context.editing", defaults["editing"]):
        c.boolean(e, "enabled", "context.editing")
        c.integer(e, "trigger", "context.editing")
        c.integer(e, "keep", "context.editing")
        c.integer(e, "clear_at_least", "context.editing", minimum=0)
        c.strings(e, "exclude_tools", "context.editing")
        if _ints(e, "keep", "trigger") and e["keep"] >= e["trigger"]:
            c.fail("context.editing.keep", f"must be below context.editing.trigger ({e['trigger']})", e["keep"])
    if c.fields(p, "context.compression", defaults["compression"]):
        c.boolean(p, "enabled", "context.compression")
        c.number(p, "window_share", "context.compression", nullable=False, maximum=1.0)
        c.integer(p, "keep_last", "context.compression")
        c.integer(p, "max_summary_tokens", "context.compression")
        c.boolean(p, "extract_identifiers", "context.compression")
        c.strings(p, "pin_state_keys", "context.compression")
        c.strings(p, "identifier_patterns", "context.compression")
        c.text(p, "model", "context.compression")
        for index, pattern in enumerate(p.get("identifier_patterns") or []):
            try:
                re.compile(str(pattern))
            except re.error as exc:
                c.fail(
                    f"context.compression.identifier_patterns[{index}]",
                    f"is not a valid regular expression ({exc})",
                    pattern,
                )
    both = isinstance(s, dict) and isinstance(e, dict) and s.get("enabled") is True and e.get("enabled") is True
    if both and _ints(s, "token_threshold") and _ints(e, "trigger") and s["token_threshold"] >= e["trigger"]:
        c.fail(
            "context.summarization.token_threshold",
            f"must be below context.editing.trigger ({e['trigger']}); otherwise context editing clears the "
            "request before summarization runs and a fresh summary is cut",
            s["token_threshold"],
        )
    window = ctx.get("context_window")
    summarizing = isinstance(s, dict) and s.get("enabled") is True and _ints(s, "token_threshold")
    compressing = isinstance(p, dict) and p.get("enabled") is True and isinstance(p.get("window_share"), int | float)
    if summarizing and compressing and isinstance(window, int) and not isinstance(window, bool):
        limit = int(window * float(p["window_share"]))
        if s["token_threshold"] >= limit:
            c.fail(
                "context.summarization.token_threshold",
                f"must be below compression's threshold ({limit} = window_share x context_window); "
                "otherwise compression always runs first and summarization never does",
                s["token_threshold"],
            )


def _ints(node: Mapping[str, Any], *keys: str) -> bool:
    return all(isinstance(node.get(k), int) and not isinstance(node.get(k), bool) for k in keys)
