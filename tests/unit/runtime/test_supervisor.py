"""Supervisor routing (``policy.supervisor``): rules decide without a model, the model's choice is read strictly,
and a bad section is refused with the path at fault."""

from __future__ import annotations

from typing import Any

import pytest

from llm.intent import mentions
from llm.planner import DeterministicPlanner
from runtime.config import check_policy, parse_policy
from runtime.supervisor import SupervisorPolicy, route_by_rules, route_choices, route_from_response
from runtime.types import ModelRequest, ModelResponse, ToolCall, Usage

SECTION: dict[str, Any] = {
    "sub_agents": [
        {"agent": "billing", "description": "Refunds, charges, invoices and money back"},
        {"agent": "logistics", "description": "Shipping, delivery and parcel tracking"},
        {"agent": "general", "description": "Anything else"},
    ],
    "mode": "rules",
    "rules": [
        {"agent": "billing", "regex": r"\bINV-\d{4}\b"},
        {"agent": "logistics", "keywords": ["parcel", "快递"]},
        {"agent": "billing", "intent": ["refund"]},
    ],
    "fallback": "general",
}


def _policy(**changes: Any) -> SupervisorPolicy:
    policy = parse_policy({"supervisor": {**SECTION, **changes}}).policy.supervisor
    assert policy is not None
    return policy


@pytest.mark.parametrize(("text", "agent", "why"), [
    ("Please explain invoice INV-2024 to me", "billing", {"rule": 0, "regex": r"\bINV-\d{4}\b", "matched": "INV-2024"}),
    ("Where is my PARCEL?", "logistics", {"rule": 1, "keyword": "parcel"}),
    ("我的快递到哪了", "logistics", {"rule": 1, "keyword": "快递"}),
    ("I want my money back", "billing", {"rule": 2, "intent": "refund"}),
    ("我要退款", "billing", {"rule": 2, "intent": "refund"}),
])
def test_the_first_matching_rule_routes_and_says_what_matched(text: str, agent: str, why: dict[str, Any]) -> None:
    route = route_by_rules(_policy(), text, intent=mentions)
    assert (route.agent, route.reason, route.detail) == (agent, "rule", why)


def test_a_keyword_matches_whole_words_only() -> None:
    route = route_by_rules(_policy(), "my parcels-tracker app crashed")  # "parcels" is not the keyword "parcel"
    assert (route.agent, route.reason) == ("general", "fallback")


def test_a_regex_is_bounded_in_length_and_in_the_text_it_searches() -> None:
    errors = check_policy({"supervisor": {**SECTION, "rules": [{"agent": "billing", "regex": "a" * 201}]}})
    assert errors == ["supervisor.rules[0].regex: must be at most 200 characters, got 201"]
    assert route_by_rules(_policy(), "x" * 1990 + " INV-2024").agent == "billing"
    assert route_by_rules(_policy(), "x" * 2000 + " INV-2024").reason == "fallback", "past the searched prefix"


def test_nothing_matching_goes_to_the_fallback_or_nowhere_saying_why() -> None:
    route = route_by_rules(_policy(), "tell me a joke", intent=mentions)
    assert (route.agent, route.reason, route.detail) == ("general", "fallback", {"why": "no rule matched"})
    route = route_by_rules(_policy(fallback=None), "tell me a joke", intent=mentions)
    assert (route.agent, route.reason) == (None, "none")
    assert "no fallback" in route.detail["why"]
    assert route.payload("rules") == {"mode": "rules", "agent": None, "reason": "none", **route.detail}


def test_the_models_first_valid_choice_routes_and_an_invalid_one_falls_back() -> None:
    policy = _policy(mode="llm", rules=[])
    def reply(*names: str) -> ModelResponse:
        return ModelResponse(None, [ToolCall(f"c{i}", n, "{}") for i, n in enumerate(names)], Usage(1, 1, 0.0), "m/x")
    route = route_from_response(policy, reply("route_to_nobody", "route_to_logistics", "route_to_billing"))
    assert (route.agent, route.reason, route.detail["choice"]) == ("logistics", "model", "route_to_logistics")
    route = route_from_response(policy, reply("query_order"))
    assert (route.agent, route.reason) == ("general", "fallback")
    assert "query_order" in route.detail["why"]
    assert route_from_response(policy, ModelResponse("hi", [], Usage(1, 1, 0.0), "m/x")).detail["why"] == \
        "the model chose no sub-agent"


def test_the_deterministic_planner_routes_by_the_sub_agents_descriptions() -> None:
    policy = _policy(mode="llm", rules=[])
    planner = DeterministicPlanner()
    for text, agent in (("where is the parcel I ordered, tracking please", "logistics"), ("I want a refund", "billing")):
        request = ModelRequest("demo/planner", [{"role": "user", "content": text}], route_choices(policy))
        route = route_from_response(policy, planner.complete(request))
        assert (route.agent, route.reason) == (agent, "model"), text


@pytest.mark.parametrize(("section", "expected"), [
    ({**SECTION, "rules": [{"agent": "billing", "regex": "(unclosed"}]},
     "supervisor.rules[0].regex: is not a valid regular expression"),
    ({**SECTION, "rules": [{"agent": "nobody", "keywords": ["x"]}]},
     "supervisor.rules[0].agent: must be one of the sub_agents ['billing', 'logistics', 'general'], got 'nobody'"),
    ({**SECTION, "fallback": "nobody"}, "supervisor.fallback: must be one of the sub_agents"),
    ({**SECTION, "mode": "vote"}, "supervisor.mode: must be one of ['llm', 'rules'], got 'vote'"),
    ({**SECTION, "sub_agents": []}, "supervisor.sub_agents: must list at least one sub-agent"),
    ({**SECTION, "sub_agents": [{"agent": "billing"}]}, "supervisor.sub_agents[0].description: is required"),
    ({**SECTION, "sub_agents": SECTION["sub_agents"] * 2}, "supervisor.sub_agents[3].agent: names 'billing' twice"),
    ({**SECTION, "rules": [{"agent": "billing"}]}, "supervisor.rules[0]: must name at least one of intent, keywords or regex"),
    ({**SECTION, "rules": [], "fallback": None}, 'supervisor.rules: mode "rules" needs at least one rule or a fallback'),
    ({**SECTION, "sub_agents": [{"agent": "bad slug!", "description": "x"}]}, "supervisor.sub_agents[0].agent: must be an agent slug"),
])
def test_an_invalid_section_is_refused_naming_the_path(section: dict[str, Any], expected: str) -> None:
    errors = check_policy({"supervisor": section})
    assert any(e.startswith(expected) for e in errors), errors


def test_a_policy_without_a_supervisor_is_unchanged() -> None:
    assert parse_policy({}).policy.supervisor is None
    assert parse_policy({}).document["supervisor"] is None
