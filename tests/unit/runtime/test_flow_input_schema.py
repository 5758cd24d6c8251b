"""A flow's input_schema: checked at save (a JSON Schema of an object; mappings read only keys it allows) and, for
each run, the input against it, every problem naming its field."""

from __future__ import annotations

import copy
from typing import Any

from runtime.documents import parse, problems
from runtime.flows import FlowDefinition, input_problems, referenced_inputs
from tests.unit.runtime.test_flows import REFUND_DESK

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id", "amount"],
    "additionalProperties": False,
    "properties": {
        "order_id": {"type": "string", "pattern": "^O\\d{12}$", "description": "the order number, e.g. O202411280001"},
        "amount": {"type": ["string", "number"]},
        "note": {"type": "string"},
    },
}


def _with(schema: Any) -> dict[str, Any]:
    doc = copy.deepcopy(REFUND_DESK)
    doc["input_schema"] = schema
    return doc


def _errors(doc: Any) -> list[str]:
    return problems(FlowDefinition, doc)[1]


def test_a_flow_with_an_input_schema_saves_and_keeps_it() -> None:
    flow = parse(FlowDefinition, _with(SCHEMA))
    assert flow.input_schema == SCHEMA
    assert parse(FlowDefinition, REFUND_DESK).input_schema is None  # optional: without it any object is taken


def test_a_schema_that_is_not_json_schema_is_refused_with_its_path() -> None:
    errors = _errors(_with({"type": "object", "properties": {"order_id": {"type": "strin"}}}))
    assert len(errors) == 1 and errors[0].startswith("input_schema.properties.order_id.type: not a valid JSON Schema"), errors


def test_the_schema_must_describe_an_object() -> None:
    assert _errors(_with({"type": "array"})) == [
        'input_schema.type: must be "object": a flow\'s input is a JSON object (its keys are read as input.<key>); '
        'got "array"']
    assert _errors(_with({"properties": {}}))[0].startswith('input_schema.type: must be "object"')
    assert _errors(_with("not a schema"))[0].startswith("input_schema:")


def test_a_mapping_that_reads_a_key_the_schema_rules_out_is_refused() -> None:
    schema = {**SCHEMA, "properties": {"amount": {"type": "number"}}, "required": []}
    errors = _errors(_with(schema))
    assert errors == [
        "nodes[0].inputs.order_id: reads input.order_id, which the flow's input_schema does not allow (its "
        "properties are ['amount']); declare it or read another key",
        "nodes[1].inputs.order_id: reads input.order_id, which the flow's input_schema does not allow (its "
        "properties are ['amount']); declare it or read another key",
        "nodes[3].preview: reads input.order_id, which the flow's input_schema does not allow (its "
        "properties are ['amount']); declare it or read another key",
        "nodes[4].inputs.order_id: reads input.order_id, which the flow's input_schema does not allow (its "
        "properties are ['amount']); declare it or read another key",
    ]
    open_schema = {**schema, "additionalProperties": True}
    assert _errors(_with(open_schema)) == []  # other keys are allowed: the mapping may find one


def test_referenced_inputs_are_the_keys_under_input() -> None:
    assert referenced_inputs("input.order_id") == {"order_id"}
    assert referenced_inputs("to_number(input.amount) > `200` && nodes.order.total") == {"amount"}
    assert referenced_inputs("nodes.input.x") == set()


def test_each_problem_with_an_input_names_its_field() -> None:
    assert input_problems(SCHEMA, {"order_id": "O202411280001", "amount": "30.00"}) == []
    assert input_problems(SCHEMA, {}) == [
        "input.amount: required",
        "input.order_id: required (the order number, e.g. O202411280001)",
    ]
    found = input_problems(SCHEMA, {"order_id": "O12", "amount": None, "extra": 1, "more": 2})
    assert found == [
        "input.amount: expected string or number, got null",
        "input.order_id: 'O12' does not match '^O\\\\d{12}$'",
        "input: unknown key(s) 'extra', 'more'; the flow takes ['amount', 'note', 'order_id']",
    ]
    nested = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}}}
    assert input_problems(nested, {"items": [1, "two"]}) == ["input.items[1]: expected integer, got a string \"two\""]
    assert input_problems(None, {"anything": True}) == []
    (long,) = input_problems({"type": "object", "properties": {"note": {"maxLength": 5}}}, {"note": "x" * 10_000})
    assert long.startswith("input.note: 'xxxx") and long.endswith("… (cut)") and len(long) < 400


def test_a_flow_is_at_most_max_nodes_and_an_expression_at_most_max_expression_chars() -> None:
    from runtime.flows import MAX_EXPRESSION_CHARS, MAX_NODES

    chain = [{"id": f"n{i}", "kind": "tool", "tool": "t", "after": [f"n{i - 1}"] if i else []} for i in range(MAX_NODES)]
    assert len(parse(FlowDefinition, {"nodes": chain}).nodes) == MAX_NODES
    longer = [*chain, {"id": "one_more", "kind": "tool", "tool": "t"}]
    assert _errors({"nodes": longer}) == [
        f"nodes: must hold at most {MAX_NODES} nodes; got {MAX_NODES + 1} (split the work into flows that an agent node "
        "or a client chains)"]
    body = {"id": "m", "kind": "map", "over": "input.items", "body": {"nodes": longer}}
    assert _errors({"nodes": [body]})[0].startswith(f"nodes[0].body.nodes: must hold at most {MAX_NODES} nodes")
    deep = "input" + ".a" * MAX_EXPRESSION_CHARS
    assert _errors({"nodes": [{"id": "x", "kind": "tool", "tool": "t", "inputs": {"v": deep}}]}) == [
        f"nodes[0].inputs.v: must be at most {MAX_EXPRESSION_CHARS} characters; got {len(deep)}"]


def test_a_schema_may_only_reference_itself() -> None:
    remote = {"type": "object", "properties": {"a": {"$ref": "http://169.254.169.254/latest/meta-data"}}}
    assert _errors(_with(remote)) == ["input_schema: $ref 'http://169.254.169.254/latest/meta-data' points outside "
                                      "the schema; only references within it (#/...) are allowed"]
    local = {"type": "object", "$defs": {"id": {"type": "string"}}, "properties": {"order_id": {"$ref": "#/$defs/id"}}}
    assert _errors(_with(local)) == []
    assert input_problems(local, {"order_id": 1}) == ["input.order_id: expected string, got an integer 1"]
    # a schema stored before the check: its input is refused with a problem, never an exception (a 500)
    found = input_problems(remote, {"a": 1})
    assert len(found) == 1 and found[0].startswith("input: could not be checked against the flow's input_schema: a "
                                                   "reference in the schema does not resolve"), found
    assert found[0].endswith("an operator must fix the flow's version")


def test_a_pattern_too_large_to_compile_is_refused_at_save_with_its_path() -> None:
    heavy = {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "(a{10000}){10000}"}}}
    errors = _errors(_with(heavy))
    assert len(errors) == 1 and errors[0].startswith(
        "input_schema.properties.order_id.pattern: is too large a regular expression"), errors
