"""Budgets (tokens, cost, wall time; per run and per session), checked BEFORE every model call.

The check projects the call's worst case: estimated input tokens of the request as sent (offline
count, :mod:`runtime.tokens`) plus the request's ``max_output_tokens``, priced with the
agent's per-1M-token prices. If the projection would cross a limit the call is not made, so a run
never ends above its budget (as long as the provider honours ``max_output_tokens``). Wall time is
the time the run spent executing; pauses in WAITING do not count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.state import SESSION_USAGE
from runtime.tokens import count_messages, count_specs
from runtime.types import ModelRequest, TerminalReason, Usage

BUDGET_MESSAGE = (
    "I stopped before finishing because this {scope} reached its {what} budget. "
    "Please try a shorter or narrower request, or ask an operator to raise the budget."
)
TIMEOUT_MESSAGE = (
    "I stopped because this {scope} ran out of time. Please try again with a narrower request, or ask an operator to raise the time limit."
)


@dataclass(frozen=True)
class Stop:
    """A decision to end the run: the terminal reason, what the user reads, and why (for operators)."""

    terminal: TerminalReason
    message: str | None
    reason: str
    source: str = ""


@dataclass(frozen=True)
class GuardContext:
    usage: Usage
    state: Mapping[str, Any]
    elapsed_seconds: float
    input_price_per_million: float
    output_price_per_million: float
    default_max_output_tokens: int


class CallGuard(Protocol):
    """Checked before every model call (``request`` set) and before every tool call (``request`` None)."""

    def check(self, request: ModelRequest | None, ctx: GuardContext) -> Stop | None: ...


@dataclass(frozen=True)
class BudgetLimits:
    tokens: int | None = None
    cost: float | None = None
    wall_seconds: float | None = None


def price(input_tokens: int, output_tokens: int, input_per_million: float, output_per_million: float) -> float:
    return round(input_tokens * input_per_million / 1e6 + output_tokens * output_per_million / 1e6, 10)


def estimate_request(request: ModelRequest, default_max_output: int) -> tuple[int, int]:
    """(estimated input tokens, assumed output tokens) of a request."""
    input_tokens = count_messages(request.messages, request.model) + count_specs(request.tools, request.model)
    return input_tokens, request.max_output_tokens or default_max_output


@dataclass(frozen=True)
class BudgetGuard:
    run: BudgetLimits = field(default_factory=BudgetLimits)
    session: BudgetLimits = field(default_factory=BudgetLimits)
    name: str = "budget"

    def check(self, request: ModelRequest | None, ctx: GuardContext) -> Stop | None:
        session_prior = ctx.state.get(SESSION_USAGE) or {}
        prior = Usage.from_dict(session_prior)
        prior_seconds = float(session_prior.get("wall_seconds", 0.0) or 0.0)
        for scope, limits, base, seconds in (
            ("run", self.run, Usage(), ctx.elapsed_seconds),
            ("session", self.session, prior, prior_seconds + ctx.elapsed_seconds),
        ):
            if limits.wall_seconds is not None and seconds >= limits.wall_seconds:
                return Stop(
                    TerminalReason.TIMEOUT,
                    TIMEOUT_MESSAGE.format(scope="request" if scope == "run" else "conversation"),
                    f"{scope} wall time {seconds:.1f}s reached the limit of {limits.wall_seconds}s",
                    self.name,
                )
            if request is None:
                continue
            stop = self._check_tokens_and_cost(scope, limits, base + ctx.usage, request, ctx)
            if stop is not None:
                return stop
        return None

    def _check_tokens_and_cost(
        self, scope: str, limits: BudgetLimits, spent: Usage, request: ModelRequest, ctx: GuardContext
    ) -> Stop | None:
        input_tokens, output_tokens = estimate_request(request, ctx.default_max_output_tokens)
        what = "request" if scope == "run" else "conversation"
        if limits.tokens is not None:
            projected = spent.total_tokens + input_tokens + output_tokens
            if projected > limits.tokens:
                return Stop(
                    TerminalReason.BUDGET_EXCEEDED,
                    BUDGET_MESSAGE.format(scope=what, what="token"),
                    f"{scope} token budget {limits.tokens}: spent {spent.total_tokens}, the next {request.task} call "
                    f"would add up to {input_tokens} in + {output_tokens} out",
                    self.name,
                )
        if limits.cost is not None:
            projected_cost = spent.cost + price(input_tokens, output_tokens, ctx.input_price_per_million, ctx.output_price_per_million)
            if projected_cost > limits.cost:
                return Stop(
                    TerminalReason.BUDGET_EXCEEDED,
                    BUDGET_MESSAGE.format(scope=what, what="cost"),
                    f"{scope} cost budget {limits.cost}: spent {spent.cost:.6f}, the next {request.task} call "
                    f"could bring it to {projected_cost:.6f}",
                    self.name,
                )
        return None
