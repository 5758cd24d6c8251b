"""Tenant-written regular expressions are matched with a time bound (runtime/patterns.py), and a tenant's JSON Schema
is applied within a budget (runtime/schemas.py): a backtracking pattern is
refused with a problem naming it, where Python's ``re`` would hold the thread (here ~3 s; with a few more characters,
minutes). Each check below would return after seconds without a ``PatternError`` if the guard were gone."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from marketplace.installs import config_errors
from runtime import patterns, schemas
from runtime.compaction import extract_identifiers
from runtime.config import parse_policy
from runtime.flows import input_problems
from runtime.supervisor import route_by_rules
from tools.arguments import parse_arguments

#: Catastrophic backtracking: Python's re takes ~3 s on EVIL, the regex engine longer; both far past the bound.
SLOW = r"(a|aa)+$"
EVIL = "a" * 34 + "!"

#: No pattern, yet 4 ** depth: each level tries a branch that descends twice (items and contains) and fails at the
#: bottom before the one that holds. Unbounded, NESTED takes about 6 s (depth 16; depth 20 would take half an hour).
BRANCHY: dict[str, Any] = {"$defs": {"n": {"anyOf": [
    {"type": "array", "items": {"$ref": "#/$defs/n"}, "contains": {"const": "never"}},
    {"type": "array", "items": {"$ref": "#/$defs/n"}},
    {"type": "integer"}]}}, "$ref": "#/$defs/n"}


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


NESTED = _nested(16)


def test_jsonschema_matches_patterns_through_the_bounded_search() -> None:
    assert patterns.jsonschema_guarded()


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"q": {"type": "string", "pattern": SLOW}}},
    {"type": "object", "patternProperties": {SLOW: {"type": "string"}}},
    {"type": "object", "patternProperties": {SLOW: {"type": "string"}}, "additionalProperties": False},
    {"type": "object", "patternProperties": {SLOW: {"type": "string"}}, "unevaluatedProperties": False},
], ids=["pattern", "patternProperties", "additionalProperties", "unevaluatedProperties"])
def test_every_keyword_that_matches_a_pattern_stops_at_the_bound(schema: dict[str, Any]) -> None:
    instance = {"q": EVIL} if "properties" in schema else {EVIL: "x"}
    with pytest.raises(patterns.PatternError) as caught, patterns.budget():
        list(schemas.validator(schema).iter_errors(instance))
    assert caught.value.pattern == SLOW
    assert "backtracks" in str(caught.value) and "(a|aa)+$" in str(caught.value)


def test_a_schema_whose_branches_multiply_stops_at_the_budget() -> None:
    with pytest.raises(schemas.SchemaTooSlow) as caught, patterns.budget():
        list(schemas.validator(BRANCHY).iter_errors(NESTED))
    assert "anyOf" in str(caught.value) and "must be simplified" in str(caught.value)
    with patterns.budget():
        assert schemas.validator(BRANCHY).is_valid(_nested(3))  # a shallow value is checked as usual
        assert not schemas.validator(BRANCHY).is_valid([*_nested(3), "x"])


def test_patterns_match_as_re_does_within_the_bound() -> None:
    validator = schemas.validator({"type": "string", "pattern": r"^O\d{3}$"})
    assert validator.is_valid("O123") and not validator.is_valid("O12")
    assert patterns.search(r"\bINV-(\d{4})\b", "see INV-2024 now").group(1) == "2024"
    assert patterns.findall(r"O\d{3}", "O123 and O456") == re.findall(r"O\d{3}", "O123 and O456")
    assert patterns.search("x", "y") is None


def test_a_spent_budget_refuses_the_next_match_at_once() -> None:
    with patterns.budget(0), pytest.raises(patterns.PatternError):
        patterns.search("a", "a")
    with patterns.budget(10), patterns.budget(0), pytest.raises(patterns.PatternError):
        patterns.search("a", "a")  # the inner, sooner deadline applies
    assert patterns.search("a", "a") is not None  # outside any budget: the per-match bound only


def test_a_pattern_that_does_not_compile_is_named() -> None:
    assert patterns.compile_problem("(") is not None and patterns.compile_problem("(").startswith(
        "is not a valid regular expression")
    assert patterns.compile_problem(r"^\d+$") is None
    with pytest.raises(patterns.PatternError, match="is not a valid regular expression"):
        patterns.search("(", "x")


def test_a_long_pattern_is_not_kept() -> None:
    before = patterns._cached.cache_info().currsize
    long = "a" * (patterns.MAX_CACHED_CHARS + 1)
    assert patterns.search(long, long) is not None
    assert patterns._cached.cache_info().currsize == before


def test_a_flow_input_checked_against_a_slow_pattern_gets_a_problem() -> None:
    schema = {"type": "object", "properties": {"order_id": {"type": "string", "pattern": SLOW}}}
    found = input_problems(schema, {"order_id": EVIL})
    assert len(found) == 1 and found[0].startswith("input: could not be checked against the flow's input_schema")
    assert "(a|aa)+$" in found[0]
    assert input_problems(schema, {"order_id": "aa"}) == []


def test_a_flow_input_too_slow_for_its_schema_gets_a_problem() -> None:
    schema = {"type": "object", "properties": {"items": BRANCHY["$defs"]["n"]}, "$defs": BRANCHY["$defs"]}
    found = input_problems(schema, {"items": NESTED})
    assert len(found) == 1 and "took longer than its 250 ms" in found[0], found
    assert input_problems(schema, {"items": _nested(2)}) == []


def test_tool_arguments_too_slow_for_the_tools_schema_tell_the_model_the_schema_is_at_fault() -> None:
    schema = {"type": "object", "properties": {"items": BRANCHY["$defs"]["n"]}, "$defs": BRANCHY["$defs"]}
    result = parse_arguments({"items": NESTED}, schema, tool_name="search")
    assert not result.ok and "fault in the tool's schema" in result.model_message


def test_a_reference_that_does_not_resolve_is_a_check_error_not_a_crash() -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.com/schema"}}}
    with pytest.raises(schemas.CheckError, match="does not resolve"):
        schemas.problems_of(schema, {"a": 1})
    result = parse_arguments({"a": 1}, schema, tool_name="search")
    assert not result.ok and "fault in the tool's schema" in result.model_message
    assert "does not resolve" in result.model_message
    assert schemas.unsafe_parts(schema) == [
        ([], "$ref 'https://example.com/schema' points outside the schema; only references within it (#/...) are allowed")]
    assert schemas.unsafe_parts({"$defs": {"x": {}}, "items": [{"$ref": "#/$defs/x"}]}) == []


def test_tool_arguments_against_a_slow_pattern_tell_the_model_the_schema_is_at_fault() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string", "pattern": SLOW}}, "required": ["q"]}
    result = parse_arguments({"q": EVIL}, schema, tool_name="search")
    assert not result.ok
    assert "fault in the tool's schema" in result.model_message
    assert parse_arguments({"q": "aaa"}, schema, tool_name="search").ok


def test_plugin_settings_against_a_slow_pattern_get_an_error() -> None:
    schema = {"type": "object", "properties": {"prefix": {"type": "string", "pattern": SLOW}}}
    errors = config_errors(schema, {"prefix": EVIL})
    assert len(errors) == 1 and "could not be checked" in errors[0] and "backtracks" in errors[0]


def test_a_routing_rule_whose_regex_backtracks_is_passed_over_and_said() -> None:
    section = {"sub_agents": [{"agent": "billing", "description": "Money"}, {"agent": "general", "description": "Else"}],
               "mode": "rules", "fallback": "general",
               "rules": [{"agent": "billing", "regex": SLOW}, {"agent": "general", "keywords": ["parcel"]}]}
    policy = parse_policy({"supervisor": section}).policy.supervisor
    assert policy is not None
    route = route_by_rules(policy, EVIL + " parcel")
    assert (route.agent, route.reason, route.detail["rule"]) == ("general", "rule", 1)
    assert route.detail["skipped"][0].startswith("rule 0: the pattern '(a|aa)+$' took longer than")
    route = route_by_rules(policy, EVIL)
    assert (route.agent, route.reason) == ("general", "fallback") and len(route.detail["skipped"]) == 1
    assert "skipped" not in route_by_rules(policy, "a parcel").detail


def test_a_slow_identifier_pattern_is_dropped_and_the_others_still_find() -> None:
    messages = [{"role": "user", "content": f"{EVIL} order O123"}, {"role": "user", "content": f"{EVIL} order O456"}]
    assert extract_identifiers(messages, [SLOW, r"O\d{3}"]) == ["O123", "O456"]


def test_a_pattern_whose_repeats_multiply_is_refused_before_it_is_compiled() -> None:
    """The regex engine writes counted repeats out when it compiles: (a{10000}){10000} took all 24 GB of this
    machine's memory. Run in a child process held to 2 GB, so a broken bound fails this test, not the machine."""
    import subprocess
    import sys

    script = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from runtime import patterns\n"
        "for p in ('(a{10000}){10000}', '(?:(?:(?:a{100}){100}){100}){100}', '(x{30}|y{40}){20}'):\n"
        "    print(patterns.compile_problem(p))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 3, done.stderr[-2000:]
    assert all(line.startswith("is too large a regular expression: its counted repeats multiply out to more than 1000")
               for line in lines), lines
    assert patterns.compile_problem(r"^O\d{12}$") is None and patterns.compile_problem(r"\w{1000}") is None
    with pytest.raises(patterns.PatternError, match="too large"):
        patterns.search(r"\w{1001}", "x")


def test_a_schemas_patterns_are_checked_at_save_with_where_they_are() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": r"\w{2000}"},
                                               "b": {"type": "string", "pattern": r"^\d+$"},
                                               "l": {"type": "array", "prefixItems": [{"pattern": "("}]}},
              "patternProperties": {"x{5000}": {}}}
    found = schemas.unsafe_parts(schema)
    assert [where for where, _ in found] == [["patternProperties"], ["properties", "a", "pattern"],
                                            ["properties", "l", "prefixItems", 0, "pattern"]]
    assert "too large" in found[0][1] and "not a valid regular expression" in found[2][1]


def test_the_budget_is_this_threads_cpu_time_not_the_wall_clock() -> None:
    with patterns.budget(0.05):
        time.sleep(0.1)  # descheduled (a busy machine, another thread holding the GIL): spends none of it
        assert not patterns.spent()
        assert patterns.search("a+b", "aab") is not None
        end = time.thread_time() + 0.06
        while time.thread_time() < end:  # computing does
            pass
        assert patterns.spent()
        with pytest.raises(patterns.PatternError):
            patterns.search("a", "a")


def test_a_budget_copied_to_another_thread_is_not_spent_on_that_threads_clock() -> None:
    import contextvars
    import threading

    end = time.thread_time() + 0.2
    while time.thread_time() < end:  # this thread's CPU clock well past a fresh thread's
        pass
    carried: list[contextvars.Context] = []

    def fresh_thread() -> None:  # a budget entered on a fresh thread (its clock near 0), its context carried off
        with patterns.budget(0.05):
            carried.append(contextvars.copy_context())

    worker = threading.Thread(target=fresh_thread)
    worker.start()
    worker.join()
    spent, found = carried[0].run(lambda: (patterns.spent(), patterns.search("a+b", "aab")))  # here, on this clock
    assert spent is False and found is not None
