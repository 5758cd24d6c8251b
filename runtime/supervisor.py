"""Supervisor agents: a version's ``policy.supervisor`` names sub-agents and how a request is routed to one.

Two modes. ``rules``: the first rule whose intent, keywords or regex matches the request names the sub-agent (no
model call). ``llm``: the model is offered one routing choice per sub-agent (``route_to_<slug>``, its description
the sub-agent's) and its first valid choice wins. Either way ``fallback`` takes what nothing matched or the model
did not choose validly. :class:`Route` says where and why; the agents layer records it as a ``supervisor.route``
event and runs the sub-agent as a child run. Which slugs exist (and are agents, not flows) is checked at save by the
agents layer: this module knows no database.

Pure: pydantic and the standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import model_validator

from runtime import patterns
from runtime.documents import Document, Names, choice, pattern, problems_of, text
from runtime.types import ModelResponse, ToolSpec

ROUTE_PREFIX = "route_to_"
_SLUG = r"^[-a-zA-Z0-9_]{1,64}$"
Slug = Annotated[str, pattern(_SLUG, 'must be an agent slug (letters, digits, "-" and "_"), e.g. "billing"')]
OptionalSlug = Annotated[str | None, pattern(_SLUG, 'must be an agent slug or null, e.g. "billing"', nullable=True)]
#: A tenant's regex is hostile input: it is at most this long and searches at most the request's first characters,
#: so a backtracking pattern cannot hold a worker for long.
MAX_REGEX_CHARS = 200
MAX_MATCH_CHARS = 2000
#: ``(text, concept) -> bool``: does the text mention the intent concept (the agents layer passes ``llm.intent``'s).
IntentMatcher = Callable[[str, str], bool]


class SubAgent(Document):
    agent: Slug
    description: Annotated[str, text(nullable=False, example='"Refunds, charges and invoices"')]


class RouteRule(Document):
    """Matches when any of its conditions does: an intent concept, a keyword (case-insensitive), or the regex."""

    agent: Slug
    intent: Names = []
    keywords: Names = []
    regex: Annotated[str | None, text()] = None

    @model_validator(mode="after")
    def _something(self) -> RouteRule:
        found = []
        if not (self.intent or self.keywords or self.regex):
            found.append("$: must name at least one of intent, keywords or regex")
        if self.regex is not None and len(self.regex) > MAX_REGEX_CHARS:
            found.append(f"$.regex: must be at most {MAX_REGEX_CHARS} characters, got {len(self.regex)}")
        elif self.regex is not None and (problem := patterns.compile_problem(self.regex)) is not None:
            found.append(f"$.regex: {problem}")
        if found:
            raise problems_of(found)
        return self


class SupervisorPolicy(Document):
    """``policy.supervisor``: the sub-agents, the routing mode, its rules and the fallback sub-agent."""

    sub_agents: list[SubAgent]
    mode: Annotated[str, choice("llm", "rules")] = "rules"
    rules: list[RouteRule] = []
    fallback: OptionalSlug = None

    @model_validator(mode="after")
    def _consistent(self) -> SupervisorPolicy:
        found = []
        slugs = [s.agent for s in self.sub_agents]
        if not slugs:
            found.append("$.sub_agents: must list at least one sub-agent")
        for index, slug in enumerate(slugs):
            if slug in slugs[:index]:
                found.append(f"$.sub_agents[{index}].agent: names {slug!r} twice; list each sub-agent once")
        for index, rule in enumerate(self.rules):
            if rule.agent not in slugs:
                found.append(f"$.rules[{index}].agent: must be one of the sub_agents {slugs}, got {rule.agent!r}")
        if self.fallback is not None and self.fallback not in slugs:
            found.append(f"$.fallback: must be one of the sub_agents {slugs} or null, got {self.fallback!r}")
        if self.mode == "rules" and not self.rules and self.fallback is None:
            found.append('$.rules: mode "rules" needs at least one rule or a fallback')
        if found:
            raise problems_of(found)
        return self

    def slugs(self) -> list[str]:
        return [s.agent for s in self.sub_agents]


@dataclass(frozen=True)
class Route:
    """Where a request goes (``agent`` is None when nothing matched and there is no fallback) and why."""

    agent: str | None
    reason: str  # "rule" | "model" | "fallback" | "none"
    detail: dict[str, Any] = field(default_factory=dict)

    def payload(self, mode: str) -> dict[str, Any]:
        return {"mode": mode, "agent": self.agent, "reason": self.reason, **self.detail}


def _keyword_in(keyword: str, text_lower: str) -> bool:
    word = keyword.lower().strip()
    if not word:
        return False
    if word.isascii():
        return re.search(rf"(?<![a-z0-9]){re.escape(word)}(?![a-z0-9])", text_lower) is not None
    return word in text_lower


def rule_match(rule: RouteRule, message: str, intent: IntentMatcher | None = None) -> dict[str, Any] | None:
    """What of ``rule`` matched ``message`` (``{"intent": ...}``, ``{"keyword": ...}`` or ``{"regex": ..., "matched":
    ...}``), or None."""
    lower = message.lower()
    if intent is not None:
        for concept in rule.intent:
            if intent(message, concept):
                return {"intent": concept}
    for keyword in rule.keywords:
        if _keyword_in(keyword, lower):
            return {"keyword": keyword}
    if rule.regex is not None:  # a tenant's pattern: matched within a time bound (PatternError past it)
        found = patterns.search(rule.regex, message[:MAX_MATCH_CHARS])
        if found is not None:
            return {"regex": rule.regex, "matched": found.group(0)[:80]}
    return None


def route_by_rules(policy: SupervisorPolicy, message: str, intent: IntentMatcher | None = None) -> Route:
    """The first matching rule's sub-agent, else the fallback: deterministic, no model call. A rule whose regex cannot
    be matched in time is passed over, and the route says so (``skipped``)."""
    skipped: list[str] = []
    with patterns.budget():
        for index, rule in enumerate(policy.rules):
            try:
                matched = rule_match(rule, message, intent)
            except patterns.PatternError as exc:
                skipped.append(f"rule {index}: {exc}")
                continue
            if matched is not None:
                return Route(rule.agent, "rule", {"rule": index, **matched, **({"skipped": skipped} if skipped else {})})
    route = fallback_route(policy, "no rule matched")
    return Route(route.agent, route.reason, {**route.detail, "skipped": skipped}) if skipped else route


def fallback_route(policy: SupervisorPolicy, why: str) -> Route:
    if policy.fallback is None:
        return Route(None, "none", {"why": f"{why} and there is no fallback"})
    return Route(policy.fallback, "fallback", {"why": why})


def route_choices(policy: SupervisorPolicy) -> list[ToolSpec]:
    """One routing choice per sub-agent, offered to the model as a tool without arguments."""
    return [
        ToolSpec(ROUTE_PREFIX + s.agent,
                 f"Hand the request to the sub-agent {s.agent!r}: {s.description}",
                 {"type": "object", "properties": {}, "additionalProperties": False})
        for s in policy.sub_agents
    ]


def route_from_response(policy: SupervisorPolicy, response: ModelResponse) -> Route:
    """The model's first valid routing choice, else the fallback (saying what the model did instead)."""
    by_name = {spec.name: s.agent for spec, s in zip(route_choices(policy), policy.sub_agents, strict=True)}
    picked = [c.name for c in response.tool_calls]
    for name in picked:
        if name in by_name:
            return Route(by_name[name], "model", {"choice": name, "model": response.model})
    if picked:
        return fallback_route(policy, f"the model chose no valid sub-agent (it called {json.dumps(picked)[:200]})")
    return fallback_route(policy, "the model chose no sub-agent")
