"""The runtime policy as a typed document: every field, its default, its check and its JSON Schema in one place.

:class:`Policy` is what :func:`runtime.config.parse_policy` returns inside a ``RuntimePolicy``; the loop's parts
are built from its attributes. Hook and interceptor entries are checked against the table of extension kinds
passed as ``context={"extensions": table}``; approval entries by :mod:`runtime.approval_policy`; state strategies
by :mod:`runtime.state`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import ValidationInfo, field_validator, model_validator

from runtime import patterns
from runtime.approval_policy import ApprovalOverride
from runtime.approval_policy import policy_errors as approval_policy_errors
from runtime.compaction import DEFAULT_IDENTIFIER_PATTERNS
from runtime.documents import (
    HERE,
    Document,
    Flag,
    Leaf,
    Names,
    choice,
    integer,
    json_list,
    json_object,
    json_schema,
    number,
    pattern,
    problem,
    problems_of,
    text,
)
from runtime.plugins import ExtensionRegistry, Role, default_registry
from runtime.state import parse_strategies
from runtime.supervisor import SupervisorPolicy

BUILTIN_HOOK_NAMES = ("model_call_limit", "tier_limit", "loop_detection", "budget")
MODEL_TASKS = ("act", "summarize")
#: What ``input_masking.raw`` may name: personal data an agent may need verbatim (the masking rules are in
#: ``audit.masking``, whose ``OPTIONAL_PATTERNS`` is the same set). Card numbers and secrets are not optional.
RAW_INPUT_PATTERNS = ("email", "id_number", "phone")
_MODEL_NAME = r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.:@/-]+$"
ModelName = Annotated[str, pattern(_MODEL_NAME, 'must be "provider/model", e.g. "openai/gpt-4o-mini"')]
ExitBehavior = Annotated[str, choice("end", "error")]
Message = Annotated[str | None, text()]
Count = Annotated[int, integer()]
#: Paths in the messages of the sub-document checkers start here (``runtime.documents.HERE``).
HERE_PATH = HERE
OptionalCount = Annotated[int | None, integer(nullable=True)]


def _extensions(info: ValidationInfo) -> ExtensionRegistry:
    table = (info.context or {}).get("extensions")
    return table if isinstance(table, ExtensionRegistry) else default_registry()


def _version_one(value: Any) -> int:
    if value != 1 or isinstance(value, bool):
        raise problem("must be 1", value)
    return 1


def _entries(message: str) -> Leaf:
    """A list of extension entries; its items are checked by the model's validator against the table."""
    return json_list(message, {"type": "array", "items": {"type": "object"}})


class StatePolicy(Document):
    strategies: Annotated[dict[str, str], json_object(
        "must be an object of key -> 'append'|'replace'",
        {"type": "object", "additionalProperties": {"enum": ["append", "replace"]}},
    )] = {}

    @field_validator("strategies")
    @classmethod
    def _strategies(cls, value: dict[str, Any]) -> dict[str, Any]:
        found = parse_strategies(value, path=HERE_PATH)[1]
        if found:
            raise problems_of(found)
        return value


class ModelCalls(Document):
    run_limit: OptionalCount = 8
    thread_limit: OptionalCount = None
    exit_behavior: ExitBehavior = "end"
    message: Message = None


class Tiers(Document):
    enabled: Flag = False
    table: Annotated[dict[str, int], json_object(
        'must be an object of tier -> model-call limit, e.g. {"free": 3, "vip": 10}',
        {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}},
    )] = {}
    default_tier: Annotated[str | None, text()] = None
    scope: Annotated[str, choice("run", "session")] = "run"
    exit_behavior: ExitBehavior = "end"
    message: Message = None

    @field_validator("table")
    @classmethod
    def _table(cls, value: dict[str, Any]) -> dict[str, Any]:
        wrong = [f"$.{tier}: must be a positive integer, got {limit!r}" for tier, limit in value.items()
                 if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1]
        if wrong:
            raise problems_of(wrong)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Tiers:
        found = []
        if self.enabled and not self.table:
            found.append("$.table: must list at least one tier when the tier limit is enabled")
        if self.default_tier is not None and self.default_tier not in self.table:
            found.append(f"$.default_tier: must be null or one of the tiers in the table {sorted(self.table)}, "
                         f"got {self.default_tier!r}")
        if found:
            raise problems_of(found)
        return self


class Limits(Document):
    max_recursion: Count = 10
    model_calls: ModelCalls = ModelCalls()
    tiers: Tiers = Tiers()


class Budget(Document):
    tokens: OptionalCount = None
    cost: Annotated[float | None, number()] = None
    wall_seconds: Annotated[float | None, number()] = None


class RunBudget(Budget):
    wall_seconds: Annotated[float | None, number()] = 300


class Budgets(Document):
    max_output_tokens: Count = 1024
    run: RunBudget = RunBudget()
    session: Budget = Budget()

    @model_validator(mode="after")
    def _fits(self) -> Budgets:
        found = [
            f"$.{scope}.tokens: must be at least budgets.max_output_tokens ({self.max_output_tokens}) or no call fits, "
            f"got {budget.tokens!r}"
            for scope, budget in (("run", self.run), ("session", self.session))
            if budget.tokens is not None and budget.tokens < self.max_output_tokens
        ]
        if found:
            raise problems_of(found)
        return self


class LoopDetectionPolicy(Document):
    enabled: Flag = True
    max_repeats: Annotated[int | None, integer(2, nullable=True)] = 3
    max_consecutive_failures: OptionalCount = 3
    message: Message = None


class SummarizationPolicy(Document):
    enabled: Flag = False
    token_threshold: Count = 6000
    keep_last: Count = 6
    model: Message = None
    max_summary_tokens: Count = 512


class EditingPolicy(Document):
    enabled: Flag = False
    trigger: Count = 12000
    keep: Count = 6000
    clear_at_least: Annotated[int, integer(0)] = 0
    exclude_tools: Names = []

    @model_validator(mode="after")
    def _keep_below_trigger(self) -> EditingPolicy:
        if self.keep >= self.trigger:
            raise problem(f"must be below context.editing.trigger ({self.trigger})", self.keep, at=".keep")
        return self


class CompressionPolicy(Document):
    enabled: Flag = True
    window_share: Annotated[float, number(nullable=False, maximum=1.0)] = 0.7
    keep_last: Count = 6
    pin_state_keys: Names = []
    extract_identifiers: Flag = True
    identifier_patterns: Names = list(DEFAULT_IDENTIFIER_PATTERNS)
    model: Message = None
    max_summary_tokens: Count = 512

    @field_validator("identifier_patterns")
    @classmethod
    def _compiles(cls, value: list[str]) -> list[str]:
        found = []
        for index, source in enumerate(value):
            if (problem := patterns.compile_problem(source)) is not None:
                found.append(f"$[{index}]: {problem}")
        if found:
            raise problems_of(found)
        return value


class ContextPolicy(Document):
    context_window: OptionalCount = None
    summarization: SummarizationPolicy = SummarizationPolicy()
    editing: EditingPolicy = EditingPolicy()
    compression: CompressionPolicy = CompressionPolicy()

    @model_validator(mode="after")
    def _order(self) -> ContextPolicy:
        s, e, p = self.summarization, self.editing, self.compression
        found = []
        if s.enabled and e.enabled and s.token_threshold >= e.trigger:
            found.append(
                f"$.summarization.token_threshold: must be below context.editing.trigger ({e.trigger}); otherwise context "
                f"editing clears the request before summarization runs and a fresh summary is cut, got {s.token_threshold!r}")
        if s.enabled and p.enabled and self.context_window is not None:
            limit = int(self.context_window * float(p.window_share))
            if s.token_threshold >= limit:
                found.append(
                    f"$.summarization.token_threshold: must be below compression's threshold ({limit} = window_share x "
                    "context_window); otherwise compression always runs first and summarization never does, "
                    f"got {s.token_threshold!r}")
        if found:
            raise problems_of(found)
        return self


class ApprovalsPolicy(Document):
    stop_on_rejection: Flag = False
    tools: Annotated[dict[str, dict[str, Any]], json_object(
        'must map tool names to approval policies, e.g. {"refund_order": {"mode": "always"}}',
        {"type": "object", "additionalProperties": json_schema(ApprovalOverride)},
    )] = {}

    @field_validator("tools")
    @classmethod
    def _entries(cls, value: dict[str, Any]) -> dict[str, Any]:
        # Whether an entry is looser than the tool's own policy (its floor) needs the tools: agents.services.
        if not all(isinstance(entry, dict) for entry in value.values()):
            raise problem('must map tool names to approval policies, e.g. {"refund_order": {"mode": "always"}}', value)
        found = [e for name, entry in value.items() for e in approval_policy_errors(entry, path=f"$.{name}", allow_override=True)]
        if found:
            raise problems_of(found)
        return value


class InputMasking(Document):
    raw: Annotated[list[str], json_list(
        f"must be a list of names from {list(RAW_INPUT_PATTERNS)} (card numbers, passwords, tokens and keys are always masked)",
        {"type": "array", "items": {"enum": list(RAW_INPUT_PATTERNS)}},
    )] = []

    @field_validator("raw")
    @classmethod
    def _known(cls, value: list[Any]) -> list[Any]:
        if any(name not in RAW_INPUT_PATTERNS for name in value):
            raise problem(f"must be a list of names from {list(RAW_INPUT_PATTERNS)} (card numbers, passwords, "
                          "tokens and keys are always masked)", value)
        return value


class Interceptors(Document):
    model: Annotated[list[dict[str, Any]], _entries("must be a list of model interceptor objects")] = []
    tool: Annotated[list[dict[str, Any]], _entries("must be a list of tool interceptor objects")] = []

    @field_validator("model")
    @classmethod
    def _model(cls, value: list[Any], info: ValidationInfo) -> list[Any]:
        return _checked(value, _extensions(info).check_entries(Role.MODEL_INTERCEPTOR, value, path=HERE_PATH))

    @field_validator("tool")
    @classmethod
    def _tool(cls, value: list[Any], info: ValidationInfo) -> list[Any]:
        return _checked(value, _extensions(info).check_entries(Role.TOOL_INTERCEPTOR, value, path=HERE_PATH))


class ModelRouting(Document):
    fallbacks: list[ModelName] = []
    task_models: Annotated[dict[str, str], json_object(
        f'must be an object of task -> "provider/model" (tasks: {list(MODEL_TASKS)})',
        {"type": "object", "properties": {t: {"type": "string", "pattern": _MODEL_NAME} for t in MODEL_TASKS},
         "additionalProperties": False},
    )] = {}

    @field_validator("task_models")
    @classmethod
    def _tasks(cls, value: dict[str, Any]) -> dict[str, Any]:
        found = []
        for task, name in value.items():
            if task not in MODEL_TASKS:
                found.append(f"$.{task}: unknown task class; expected one of {list(MODEL_TASKS)}")
            elif not isinstance(name, str) or not re.match(_MODEL_NAME, name):
                found.append(f'$.{task}: must be "provider/model", e.g. "openai/gpt-4o-mini", got {name!r}')
        if found:
            raise problems_of(found)
        return value


class Policy(Document):
    """An agent version's runtime policy (see :mod:`runtime.config` for the annotated shape)."""

    version: Annotated[int, Leaf(_version_one, {"const": 1})] = 1
    state: StatePolicy = StatePolicy()
    limits: Limits = Limits()
    budgets: Budgets = Budgets()
    loop_detection: LoopDetectionPolicy = LoopDetectionPolicy()
    context: ContextPolicy = ContextPolicy()
    approvals: ApprovalsPolicy = ApprovalsPolicy()
    input_masking: InputMasking = InputMasking()
    hooks: Annotated[list[dict[str, Any]], _entries("must be a list of hook objects")] = []
    interceptors: Interceptors = Interceptors()
    model: ModelRouting = ModelRouting()
    #: Set on a supervisor agent: its sub-agents and how a request is routed to one (:mod:`runtime.supervisor`).
    supervisor: SupervisorPolicy | None = None

    @field_validator("hooks")
    @classmethod
    def _hooks(cls, value: list[Any], info: ValidationInfo) -> list[Any]:
        found = _extensions(info).check_entries(Role.HOOK, value, path=HERE_PATH, reserved=BUILTIN_HOOK_NAMES)
        return _checked(value, found)


def _checked(value: list[Any], found: list[str]) -> list[Any]:
    if found:
        raise problems_of(found)
    return value
