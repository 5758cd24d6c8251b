"""Flow definitions: validation with JSON paths, and the scheduler's order (diamond, wide fan-out, switch, errors)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from runtime.documents import DocumentError, parse, problems
from runtime.expressions import ValueTooLarge
from runtime.flows import (
    BodyNode,
    FlowCatalog,
    FlowDefinition,
    MapStep,
    NodeState,
    Plan,
    choose,
    evaluate,
    node_arguments,
    plan,
    plan_map,
    referenced_nodes,
    render,
)

REFUND_DESK: dict[str, Any] = {
    "scopes": ["orders:read", "orders:refund"],
    "nodes": [
        {"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
        {"id": "logistics", "kind": "tool", "tool": "query_logistics", "inputs": {"order_id": "input.order_id"}},
        {"id": "route", "kind": "switch", "after": ["order", "logistics"],
         "cases": [{"when": "nodes.order.amount > `100`", "goto": ["approve"]}], "default": ["refund"]},
        {"id": "approve", "kind": "approval", "preview": "Refund {nodes.order.amount} for {input.order_id}?"},
        {"id": "refund", "kind": "tool", "tool": "refund_order", "after": ["approve"],
         "inputs": {"order_id": "input.order_id"}, "values": {"reason": "flow"}},
        {"id": "summary", "kind": "llm", "after": ["refund"], "prompt": "Summarize: {nodes.refund}"},
    ],
    "output": "nodes.summary",
}
CATALOG = FlowCatalog(tools={"query_order": ["orders:read"], "query_logistics": [], "refund_order": ["orders:refund"]},
                      agents=["order-assistant"])


def _errors(doc: Any, catalog: FlowCatalog | None = None) -> list[str]:
    return problems(FlowDefinition, doc, context={"catalog": catalog} if catalog else None)[1]


def _flow(nodes: list[dict[str, Any]], **extra: Any) -> FlowDefinition:
    return parse(FlowDefinition, {"nodes": nodes, **extra})


def test_the_refund_desk_is_a_valid_flow_with_its_defaults() -> None:
    flow = parse(FlowDefinition, REFUND_DESK, context={"catalog": CATALOG})
    assert flow.max_parallel == 4 and flow.node("order").on_error == "fail" and flow.node("order").timeout_seconds == 60
    assert flow.dependencies()["approve"] == {"route"} and flow.dependencies()["refund"] == {"approve", "route"}
    assert flow.order()[:2] in (["order", "logistics"], ["logistics", "order"])


def test_a_cycle_is_named() -> None:
    errors = _errors({"nodes": [{"id": "a", "kind": "tool", "tool": "t", "after": ["c"]},
                                {"id": "b", "kind": "tool", "tool": "t", "after": ["a"]},
                                {"id": "c", "kind": "tool", "tool": "t", "after": ["b"]}]})
    assert len(errors) == 1 and errors[0].startswith("nodes: a cycle ")
    cycle = errors[0].split("a cycle ")[1].split(";")[0].split(" -> ")
    assert cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}


def test_references_ids_and_kinds_are_checked_with_their_paths() -> None:
    errors = _errors({"nodes": [
        {"id": "a", "kind": "tool", "tool": "t", "after": ["nope"]},
        {"id": "a", "kind": "llm"},
        {"id": "B", "kind": "robot", "tool": "x"},
        {"id": "c", "kind": "llm", "prompt": "hi", "tool": "t", "on_error": "route"},
    ]})
    assert errors == [
        "nodes[1].prompt: required for a llm node",
        "nodes[2].id: must be a node id: lower-case letters, digits and _ (e.g. lookup_order), got 'B'",
        "nodes[2].kind: must be one of ['tool', 'agent', 'llm', 'approval', 'switch', 'map'], got 'robot'",
        "nodes[3].tool: not a field of a llm node; it takes ['prompt', 'output_schema', 'model']",
        'nodes[3].handler: required when on_error is "route": the node that runs instead',
    ]
    errors = _errors({"nodes": [{"id": "a", "kind": "tool", "tool": "t", "after": ["nope"]},
                                {"id": "a", "kind": "tool", "tool": "t"}]})
    assert errors == ["nodes[1].id: 'a' is already the id of nodes[0]",
                      "nodes[0].after[0]: no node 'nope'; the nodes are ['a']"]


def test_expressions_may_only_read_nodes_that_run_before() -> None:
    errors = _errors({"nodes": [
        {"id": "a", "kind": "tool", "tool": "t", "inputs": {"x": "nodes.b.value"}},
        {"id": "b", "kind": "tool", "tool": "t", "inputs": {"y": "nodes.zed", "z": "input.q"}},
        {"id": "c", "kind": "llm", "after": ["b"], "prompt": "{nodes.a.total} and {nodes.b}"},
        {"id": "d", "kind": "tool", "tool": "t", "inputs": {"bad": "nodes.[["}},
    ], "output": "nodes.e"})
    # a broken expression is refused by itself first (the graph is checked once every node is well-formed)
    assert len(errors) == 1 and errors[0].startswith("nodes[3].inputs.bad: is not a JMESPath expression ("), errors
    errors = _errors({"nodes": [
        {"id": "a", "kind": "tool", "tool": "t", "inputs": {"x": "nodes.b.value"}},
        {"id": "b", "kind": "tool", "tool": "t", "inputs": {"y": "nodes.zed", "z": "input.q"}},
        {"id": "c", "kind": "llm", "after": ["b"], "prompt": "{nodes.a.total} and {nodes.b}"},
    ], "output": "nodes.e"})
    assert errors == [
        "nodes[0].inputs.x: reads node 'b', which does not run before 'a'; add it to a.after",
        "nodes[1].inputs.y: reads node 'zed', which does not exist; the nodes are ['a', 'b', 'c']",
        "nodes[2].prompt: reads node 'a', which does not run before 'c'; add it to c.after",
        "output: reads node 'e', which does not exist; the nodes are ['a', 'b', 'c']",
    ]


def test_the_tenants_tools_agents_and_the_flows_scopes_are_checked_at_save() -> None:
    doc = copy.deepcopy(REFUND_DESK)
    doc["scopes"] = ["orders:read"]
    doc["nodes"][1]["tool"] = "track_parcel"
    doc["nodes"].append({"id": "ask", "kind": "agent", "agent": "nobody", "after": ["summary"]})
    assert _errors(doc, CATALOG) == [
        "nodes[1].tool: no tool 'track_parcel' for this tenant (its own, or from an installed plugin); the tools are "
        "['query_logistics', 'query_order', 'refund_order']",
        "nodes[4].tool: 'refund_order' needs the scopes ['orders:refund'], which the flow's scopes ['orders:read'] do not "
        "cover; add them to scopes",
        "nodes[6].agent: no agent 'nobody' for this tenant; the agents are ['order-assistant']",
    ]
    with pytest.raises(DocumentError):
        parse(FlowDefinition, doc, context={"catalog": CATALOG})


def _run(flow: FlowDefinition, *, finish: dict[str, str] | None = None,
         chosen: dict[str, list[str]] | None = None) -> list[list[str]]:
    """Drive the scheduler to the end: every ready node finishes (as ``finish`` says, else done); the waves."""
    states: dict[str, str] = {}
    waves: list[list[str]] = []
    routed: set[str] = set()
    for _ in range(50):
        routed |= {n.handler for n in flow.nodes if n.handler and states.get(n.id) == NodeState.FAILED}
        step = plan(flow, states, chosen, routed=routed)
        for node in step.skip:
            states[node] = NodeState.SKIPPED
        if step.outcome:
            waves.append([f"={step.outcome}"])
            return waves
        assert step.ready, (states, step)
        waves.append(sorted(step.ready))
        for node in step.ready:
            states[node] = (finish or {}).get(node, NodeState.DONE)
    raise AssertionError("the flow never finished")


def test_a_diamond_runs_its_two_branches_together_and_joins_once_both_are_done() -> None:
    flow = _flow([{"id": "a", "kind": "tool", "tool": "t"},
                  {"id": "b", "kind": "tool", "tool": "t", "after": ["a"]},
                  {"id": "c", "kind": "tool", "tool": "t", "after": ["a"]},
                  {"id": "d", "kind": "tool", "tool": "t", "after": ["b", "c"]}])
    assert _run(flow) == [["a"], ["b", "c"], ["d"], ["=succeeded"]]
    assert plan(flow, {"a": "done", "b": "done", "c": "running"}).ready == ()  # d waits for c


def test_a_wide_fan_out_is_bounded_by_max_parallel() -> None:
    wide = [{"id": f"n{i}", "kind": "tool", "tool": "t", "after": ["root"]} for i in range(10)]
    flow = _flow([{"id": "root", "kind": "tool", "tool": "t"}, *wide,
                  {"id": "join", "kind": "tool", "tool": "t", "after": [f"n{i}" for i in range(10)]}], max_parallel=4)
    states = {"root": "done"}
    first = plan(flow, states)
    assert len(first.ready) == 4
    states.update({n: "running" for n in first.ready})
    assert plan(flow, states).ready == ()  # no room
    states[first.ready[0]] = "done"
    assert len(plan(flow, states).ready) == 1
    waves = _run(flow)
    assert waves[0] == ["root"] and [len(w) for w in waves[1:4]] == [4, 4, 2] and waves[4] == ["join"]


def test_a_switch_runs_the_branch_it_chose_and_skips_the_other_down_to_the_join() -> None:
    flow = parse(FlowDefinition, REFUND_DESK)
    small = _run(flow, chosen={"route": ["refund"]})
    assert small == [["logistics", "order"], ["route"], ["refund"], ["summary"], ["=succeeded"]]
    large = _run(flow, chosen={"route": ["approve"]})
    assert large == [["logistics", "order"], ["route"], ["approve"], ["refund"], ["summary"], ["=succeeded"]]
    states = {"order": "done", "logistics": "done", "route": "done"}
    step = plan(flow, states, {"route": ["refund"]})
    assert step.skip == ("approve",) and step.ready == ("refund",)


def test_errors_fail_the_flow_continue_or_route_to_a_handler() -> None:
    nodes = [{"id": "a", "kind": "tool", "tool": "t"}, {"id": "b", "kind": "tool", "tool": "t", "after": ["a"]}]
    assert _run(_flow(nodes), finish={"a": "failed"}) == [["a"], ["=failed"]]
    assert plan(_flow(nodes), {"a": "failed"}).failed_node == "a"
    cont = [{**nodes[0], "on_error": "continue"}, nodes[1]]
    assert _run(_flow(cont), finish={"a": "failed"}) == [["a"], ["b"], ["=succeeded"]]
    routed = [{**nodes[0], "on_error": "route", "handler": "apologise"}, nodes[1],
              {"id": "apologise", "kind": "llm", "prompt": "Say sorry."}]
    assert _run(_flow(routed), finish={"a": "failed"}) == [["a"], ["apologise"], ["=succeeded"]]
    assert _run(_flow(routed)) == [["a"], ["b"], ["=succeeded"]]  # no failure: the handler is skipped
    assert "handler" in _errors({"nodes": [*routed[:2], {**routed[2], "after": ["b"]}]})[0]


def test_expressions_arguments_templates_and_switches_evaluate_over_input_and_outputs() -> None:
    flow = parse(FlowDefinition, REFUND_DESK)
    scope = {"input": {"order_id": "A-1"}, "nodes": {"order": {"amount": 250}}}
    assert node_arguments(flow.node("refund"), scope) == {"reason": "flow", "order_id": "A-1"}
    assert render(flow.node("approve").preview or "", scope) == "Refund 250 for A-1?"
    assert choose(flow.node("route"), scope) == ["approve"]
    assert choose(flow.node("route"), {**scope, "nodes": {"order": {"amount": 20}}}) == ["refund"]
    assert referenced_nodes("nodes.order.amount > `100` && nodes.logistics.status == 'lost'") == {"order", "logistics"}


def test_a_stored_definition_parses_back_to_itself() -> None:
    flow = parse(FlowDefinition, REFUND_DESK)
    stored = flow.to_json()
    assert parse(FlowDefinition, stored).to_json() == stored


# -- map nodes --------------------------------------------------------------------------------------------------

def _map(body: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"scopes": ["orders:read"],
            "nodes": [{"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
                      {"id": "other", "kind": "tool", "tool": "query_order"},
                      {"id": "each", "kind": "map", "after": ["order"], "over": "nodes.order.items",
                       "body": {"nodes": body}, **extra}]}


def test_a_map_body_is_validated_with_its_paths() -> None:
    ok = [{"id": "a", "kind": "tool", "tool": "query_order", "inputs": {"id": "item.id", "i": "index", "o": "nodes.order"}},
          {"id": "b", "kind": "llm", "after": ["a"], "prompt": "{nodes.a}"}]
    flow = parse(FlowDefinition, _map(ok), context={"catalog": CATALOG})
    assert flow.node("each").max_concurrency == 4 and flow.node("each").on_item_error == "fail"
    assert _errors(_map([])) == ["nodes[2].body.nodes: must be a non-empty list of nodes (of kind tool, llm, switch), got list"]
    assert _errors(_map([{"id": "a", "kind": "tool", "tool": "t", "after": ["b"]},
                         {"id": "b", "kind": "tool", "tool": "t", "after": ["a"]}]))[0].startswith(
        "nodes[2].body.nodes: a cycle ")
    assert _errors(_map(ok[:1], over="nodes.other[")) [0].startswith("nodes[2].over: is not a JMESPath expression")
    assert _errors(_map(ok[:1], max_concurrency=0)) == ["nodes[2].max_concurrency: must be an integer from 1 to 32, got 0"]
    errors = _errors(_map([{"id": "a", "kind": "tool", "tool": "t", "inputs": {"x": "nodes.other"}}]))
    assert errors[0].startswith("nodes[2].body.nodes[0].inputs.x: reads node 'other', which is not a body node nor a "
                                "flow node that runs before the map 'each'")
    assert _errors(_map([{"id": "order", "kind": "tool", "tool": "t"}]))[0].startswith("nodes[2].body.nodes[0].id: 'order'")
    assert _errors(_map([{"id": "a", "kind": "approval"}]))[0].startswith("nodes[2].body.nodes[0].kind: must be one of")
    assert _errors(_map(ok[:1], over=None))[0] == "nodes[2].over: required for a map node"
    missing = _errors(_map([{"id": "a", "kind": "tool", "tool": "nope"}]), CATALOG)
    assert missing[0].startswith("nodes[2].body.nodes[0].tool: no tool 'nope'")


def test_a_flows_tool_list_is_the_tools_its_nodes_name_map_bodies_included() -> None:
    flow = parse(FlowDefinition, _map([{"id": "a", "kind": "tool", "tool": "lookup_logistics"},
                                       {"id": "b", "kind": "llm", "after": ["a"], "prompt": "{nodes.a}"}]))
    assert flow.tool_names() == {"query_order", "lookup_logistics"}


def test_plan_runs_a_map_after_its_upstream_and_plan_map_bounds_its_items() -> None:
    flow = parse(FlowDefinition, _map([{"id": "a", "kind": "tool", "tool": "t"},
                                       {"id": "b", "kind": "tool", "tool": "t", "after": ["a"]}], max_concurrency=3))
    assert plan(flow, {}).ready == ("order", "other")
    assert plan(flow, {"order": "done", "other": "running"}).ready == ("each",)
    node = flow.node("each")
    step = plan_map(node, 10, {}, room=8)
    assert step.ready == ((0, "a"), (1, "a"), (2, "a"))  # three items at once, lowest index first
    step = plan_map(node, 10, {0: {"a": "done", "b": "done"}, 1: {"a": "done"}, 2: {"a": "running"}}, room=8)
    assert step.ready == ((1, "b"), (3, "a")) and step.over == (0,)
    assert plan_map(node, 10, {0: {"a": "done"}}, room=1).ready == ((0, "b"),)  # the run's room bounds it too
    failed = {0: {"a": "failed"}, 1: {"a": "running"}}
    assert plan_map(node, 10, failed, room=8) == MapStep(failed=(0,), over=(0,))  # fail: wait for item 1, start none
    assert plan_map(node, 10, {0: {"a": "failed"}}, room=8).outcome == "failed"
    lenient = flow.node("each").model_copy(update={"on_item_error": "continue"})
    assert plan_map(lenient, 2, failed, room=8).ready == ()  # item 1 still running; no item 2
    done = {0: {"a": "failed"}, 1: {"a": "done", "b": "done"}}
    assert plan_map(lenient, 2, done, room=8).outcome == "succeeded"
    assert plan_map(node, 0, {}, room=8).outcome == "succeeded"


def test_a_failed_node_ends_the_flow_once_a_running_maps_items_are_over() -> None:
    flow = parse(FlowDefinition, _map([{"id": "a", "kind": "tool", "tool": "t"}]))
    states = {"order": "done", "other": "failed", "each": "running"}
    assert plan(flow, states, busy=1) == Plan(failed_node="other")  # an item node still runs
    assert plan(flow, states, busy=0).outcome == "failed"
    assert plan(flow, {"order": "done", "other": "running", "each": "running"}, busy=0).ready == ()


def test_a_map_body_gets_every_check_of_the_flow_by_the_same_function() -> None:
    # a template's broken expression and an error handler that also comes after a node: refused in a body as at the top
    broken = _errors(_map([{"id": "a", "kind": "llm", "prompt": "{nodes.[[}"}]))
    assert broken[0].startswith("nodes[2].body.nodes[0].prompt: 'nodes.[[' is not a JMESPath expression ("), broken
    handler = _errors(_map([{"id": "a", "kind": "tool", "tool": "t", "on_error": "route", "handler": "h"},
                            {"id": "h", "kind": "tool", "tool": "t", "after": ["a"]}]))
    assert handler == ["nodes[2].body.nodes[1]: 'h' is an error handler, so it runs only when routed to; it cannot also "
                       "come after other nodes or be chosen by a switch"]
    assert _errors(_map([{"id": "a", "kind": "tool", "tool": "t", "after": ["a"]}])) == [
        "nodes[2].body.nodes[0].after[0]: a node cannot come after itself"]
    assert _errors(_map([{"id": "a", "kind": "tool", "tool": "t", "after": ["other"]}])) == [
        "nodes[2].body.nodes[0].after[0]: no body node 'other'; the body's nodes are ['a'] (a body node runs after "
        "body nodes only; the map itself runs after flow nodes)"]


@pytest.mark.parametrize(("roles", "problems_"), [
    (["viewer"], ["nodes[3].approver_roles[0]: a viewer only reads and cannot decide; name owner, operator or approver, "
                  "got 'viewer'"]),
    (["approver", "boss", 7], ["nodes[3].approver_roles[1]: no such role; name owner, operator or approver, got 'boss'",
                               "nodes[3].approver_roles[2]: no such role; name owner, operator or approver, got 7"]),
    ([], ["nodes[3].approver_roles: must name at least one role that may decide (owner, operator, approver): with none, "
          "no one could decide the request, got []"]),
    ("owner", ["nodes[3].approver_roles: must be a list of roles that may decide (owner, operator, approver), got 'owner'"]),
])
def test_an_approval_nodes_approver_roles_are_roles_that_may_decide(roles: Any, problems_: list[str]) -> None:
    doc = copy.deepcopy(REFUND_DESK)
    doc["nodes"][3]["approver_roles"] = roles
    assert _errors(doc) == problems_
    doc["nodes"][3]["approver_roles"] = ["operator", "owner"]
    assert parse(FlowDefinition, doc).node("approve").approver_roles == ["operator", "owner"]


# -- expressions whose work grows past the bound: refused at save (issue #49) ---------------------------------


def _doubling(k: int) -> str:
    """Two trees of 2 ** k leaves sharing their branches, compared: 2 ** k steps of work whatever the data."""
    return "[input.a, input.b]" + " | [[@[0],@[0]],[@[1],@[1]]]" * k + " | @[0] == @[1]"


def _with(where: str, expression: str) -> tuple[dict[str, Any], str]:
    """A flow that evaluates ``expression`` at ``where``, and the path its problem names."""
    tool = {"id": "a", "kind": "tool", "tool": "t"}
    body = {"nodes": [{"id": "b", "kind": "tool", "tool": "t"}]}
    return {
        "when": ({"nodes": [tool, {"id": "r", "kind": "switch", "after": ["a"], "cases": [{"when": expression,
                  "goto": ["z"]}]}, {"id": "z", "kind": "llm", "prompt": "done"}]}, "nodes[1].cases[0].when"),
        "inputs": ({"nodes": [{**tool, "inputs": {"x": expression}}]}, "nodes[0].inputs.x"),
        "over": ({"nodes": [{"id": "m", "kind": "map", "over": expression, "body": body}]}, "nodes[0].over"),
        "output": ({"nodes": [tool], "output": expression}, "output"),
        "prompt": ({"nodes": [{"id": "s", "kind": "llm", "prompt": "Say {" + expression + "}"}]}, "nodes[0].prompt"),
        "body output": ({"nodes": [{"id": "m", "kind": "map", "over": "input.l", "body": {**body, "output": expression}}]},
                        "nodes[0].body.output"),
    }[where]


@pytest.mark.parametrize("k", [29, 58])
@pytest.mark.parametrize("where", ["when", "inputs", "over", "output", "prompt", "body output"])
def test_an_expression_whose_work_doubles_at_every_step_is_refused_at_save_naming_its_path(where: str, k: int) -> None:
    definition, path = _with(where, _doubling(k))
    errors = _errors(definition)
    assert len(errors) == 1 and errors[0].startswith(f"{path}: "), errors
    assert "steps of work" in errors[0] and "[[@[0],@[0]],[@[1],@[1]]]" in errors[0], errors


@pytest.mark.parametrize("where", ["when", "inputs", "over", "output", "prompt", "body output"])
def test_an_expression_whose_work_depends_on_its_data_still_saves(where: str) -> None:
    """Eight doublings are 256 times the data's size: bounded when it runs (runtime/expressions.py), not at save."""
    definition, _ = _with(where, _doubling(8))
    assert _errors(definition) == []


def test_a_node_s_expressions_share_one_work_bound() -> None:
    """Each filter reads 10,000 items (some 40,000 steps, within the bound alone); ten of them in one node are past it
    together: a node may hold any number of expressions, and each bounded alone would not bound the node."""
    scope = {"input": {"l": list(range(10_000))}}
    one = "input.l[?@ < `0`]"
    assert evaluate(one, scope) == []
    node = parse(BodyNode, {"id": "a", "kind": "tool", "tool": "t", "inputs": {f"x{i}": one for i in range(10)}})
    with pytest.raises(ValueTooLarge, match="steps of work its node's expressions share"):
        node_arguments(node, scope)
    with pytest.raises(ValueTooLarge, match="steps of work its node's expressions share"):
        render(" ".join("{" + one + "}" for _ in range(10)), scope)
    switch = parse(BodyNode, {"id": "s", "kind": "switch", "cases": [{"when": one, "goto": ["b"]}] * 10})
    with pytest.raises(ValueTooLarge, match="steps of work its node's expressions share"):
        choose(switch, scope)
