"""The flow run's whole scheduling decision without a database (runtime/flow_plan.py): bookkeeping (skips, maps opened
and settled), restarts of dead nodes, approvals decided, the tenant's bound and the run's max_parallel, hand-overs,
starts, throttling, waiting and the end."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from runtime import flow_plan
from runtime.flow_plan import Admission, Bookkeeping, Decision, Ending, View
from runtime.flows import FlowDefinition

NOW = dt.datetime(2026, 12, 8, 12, 0, tzinfo=dt.UTC)
LIVE = NOW + dt.timedelta(seconds=60)
DEAD = NOW - dt.timedelta(seconds=1)


@dataclass
class Row:
    status: str
    kind: str = "tool"
    chosen: list[str] = field(default_factory=list)
    output: Any = None
    error: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    span_id: str = ""
    lease_expires_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None


def _flow(nodes: list[dict[str, Any]], **extra: Any) -> FlowDefinition:
    return FlowDefinition.model_validate({"nodes": nodes, **extra})


def _tool(node_id: str, after: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "kind": "tool", "tool": "t", "after": after or [], **extra}


def _decide(flow: FlowDefinition, rows: dict[str, Row], redo: tuple[str, ...] = ()) -> Decision:
    return flow_plan.decide(flow, rows, flow_input={"n": 2, "xs": [1, 2, 3]}, now=NOW, redo=redo)


CHAIN = _flow([_tool("a"), _tool("b", ["a"], inputs={"v": "nodes.a.v"}), _tool("c", ["b"])])


def test_the_first_decision_starts_the_roots_and_a_finished_node_hands_on_to_the_next() -> None:
    first = _decide(CHAIN, {})
    assert (first.ready, first.bookkeeping, first.outcome) == (("a",), None, None)
    rows = {"a": Row("done", output={"v": 7}), "b": Row("running", lease_expires_at=LIVE)}
    nxt = _decide(CHAIN, {"a": Row("done", output={"v": 7})})
    assert nxt.ready == ("b",)
    assert _decide(CHAIN, rows).ready == ()  # b runs: c waits for it
    over = _decide(CHAIN, {n: Row("done") for n in "abc"})
    assert over.outcome == "succeeded"
    assert flow_plan.ending(CHAIN, over, {n: Row("done", output=n) for n in "abc"}, flow_input={}) == Ending(
        True, output='{"a": "a", "b": "b", "c": "c"}')


def test_a_running_node_whose_lease_expired_is_started_again_with_its_span_and_the_next_attempt() -> None:
    rows = {"a": Row("done", output={"v": 7}), "b": Row("running", attempt=1, span_id="s1", lease_expires_at=DEAD)}
    decision = _decide(CHAIN, rows)
    assert decision.view.stale == {"b"} and decision.ready == ("b",)
    admission = flow_plan.admit(CHAIN, decision, bound=3, busy=0)
    [start] = flow_plan.starts(CHAIN, rows, admission, flow_input={}, grace=30)
    assert (start.node_id, start.attempt, start.span_id, start.inputs, start.lease_seconds) == ("b", 2, "s1", {"v": 7}, 90)
    assert len(start.token) == 32
    event = start.event()
    assert (event.type, event.payload, event.span_id) == (
        "flow.node.started", {"node": "b", "kind": "tool", "attempt": 2, "inputs": '{"v": 7}'}, "s1")


def test_a_mapping_that_cannot_be_evaluated_starts_the_node_with_its_error_in_its_inputs() -> None:
    flow = _flow([_tool("a", inputs={"v": "abs(input.n_text)"})])
    [start] = flow_plan.starts(flow, {}, Admission(starts=("a",)), flow_input={"n_text": "x"}, grace=0)
    assert "_mapping_error" in start.inputs


def test_a_switch_skips_its_unchosen_branch_as_bookkeeping_first() -> None:
    flow = _flow([{"id": "s", "kind": "switch", "cases": [{"when": "input.n > `1`", "goto": ["big"]}], "default": ["small"]},
                  _tool("big"), _tool("small"), _tool("join", ["big", "small"])])
    rows = {"s": Row("done", kind="switch", chosen=["big"])}
    decision = _decide(flow, rows)
    assert decision.bookkeeping == Bookkeeping(skip=("small",))
    assert [e.type for e in decision.bookkeeping.events()] == ["flow.node.skipped"]
    rows["small"] = Row("skipped", kind="")
    assert _decide(flow, rows).ready == ("big",)


def test_the_tenants_bound_holds_nodes_and_an_approval_takes_no_place() -> None:
    flow = _flow([_tool("a"), _tool("b"), {"id": "ok", "kind": "approval"}, _tool("c")], max_parallel=4)
    decision = _decide(flow, {})
    assert set(decision.ready) == {"a", "b", "c", "ok"}
    admission = flow_plan.admit(flow, decision, bound=3, busy=2)
    assert admission.asks == ("ok",) and len(admission.starts) == 1 and len(admission.held) == 2
    assert flow_plan.throttled(admission, decision, started=True, bound=3) is None
    none_room = flow_plan.admit(flow, decision, bound=3, busy=3)
    event = flow_plan.throttled(none_room, decision, started=False, bound=3)
    assert event is not None and event.payload == {"waiting": list(none_room.held), "tenant_running_nodes": 3, "limit": 3}


def test_a_hand_over_needs_no_count_but_a_fan_out_or_an_approval_does() -> None:
    decision = _decide(CHAIN, {"a": Row("done")})
    assert flow_plan.handed_over(CHAIN, decision, 0, freed=1, bound=3) == 2  # b takes a's place: the others hold <= 2
    assert flow_plan.handed_over(CHAIN, decision, 0, freed=0, bound=3) is None  # nothing freed: count
    fan = _flow([_tool("a"), _tool("b", ["a"]), _tool("c", ["a"])])
    assert flow_plan.handed_over(fan, _decide(fan, {"a": Row("done")}), 0, freed=1, bound=3) is None
    gate = _flow([_tool("a"), {"id": "ok", "kind": "approval", "after": ["a"]}])
    assert flow_plan.handed_over(gate, _decide(gate, {"a": Row("done")}), 0, freed=1, bound=3) is None


def test_own_live_counts_this_runs_running_nodes_with_a_live_lease() -> None:
    rows = {"a": Row("running", lease_expires_at=LIVE), "b": Row("running", lease_expires_at=DEAD), "c": Row("done")}
    assert flow_plan.own_live(rows, frozenset({"b"}), NOW) == 1


def test_a_decided_tool_call_runs_again_and_a_run_with_only_a_person_left_waits() -> None:
    flow = _flow([_tool("a"), {"id": "ok", "kind": "approval", "after": ["a"]}])
    waiting = {"a": Row("waiting")}
    assert _decide(flow, waiting).ready == ()
    assert _decide(flow, waiting, redo=("a",)).ready == ("a",)
    decision = _decide(flow, waiting)
    assert flow_plan.waits(decision, Admission(), started=False)
    asked = _decide(flow, {"a": Row("done")})
    admission = flow_plan.admit(flow, asked, bound=3, busy=0)
    assert admission.asks == ("ok",) and flow_plan.waits(asked, admission, started=False)
    running = _decide(flow, {"a": Row("running", lease_expires_at=LIVE)})
    assert not flow_plan.waits(running, Admission(), started=False)


MAPPED = _flow([{"id": "each", "kind": "map", "over": "input.xs", "max_concurrency": 2, "on_item_error": "continue",
                 "body": {"nodes": [_tool("x", inputs={"v": "item"})], "output": "nodes.x"}}, _tool("after", ["each"])],
               max_parallel=4)


def test_a_map_is_opened_with_its_list_then_its_items_start_within_max_concurrency() -> None:
    decision = _decide(MAPPED, {})
    assert decision.bookkeeping is not None
    [opened] = decision.bookkeeping.opened
    assert (opened.node_id, opened.items, opened.count, opened.error) == ("each", [1, 2, 3], 3, "")
    rows = {"each": Row("running", kind="map", inputs={"items": [1, 2, 3]}, span_id="m")}
    decision = _decide(MAPPED, rows)
    assert decision.maps_running and decision.wanted == (("each", 0, "x"), ("each", 1, "x"))
    admission = flow_plan.admit(MAPPED, decision, bound=3, busy=0)
    starts = flow_plan.starts(MAPPED, rows, admission, flow_input={}, grace=0)
    assert [(s.node_id, s.inputs, s.parent_span_id) for s in starts] == [("each[0].x", {"v": 1}, "m"), ("each[1].x", {"v": 2}, "m")]
    assert starts[0].event().payload == {"node": "each[0].x", "kind": "tool", "attempt": 1, "map": "each", "index": 0,
                                         "inputs": '{"v": 1}'}
    held = flow_plan.admit(MAPPED, decision, bound=1, busy=0)
    assert held.items == (("each", 0, "x"),) and held.held == ("each[1].x",)


def test_a_map_whose_items_are_over_is_settled_with_their_results_in_order() -> None:
    rows = {"each": Row("running", kind="map", inputs={"items": [1, 2, 3]}, span_id="m"),
            "each[0].x": Row("done", output="one"), "each[1].x": Row("failed", error="boom", finished_at=NOW),
            "each[2].x": Row("done", output="three")}
    decision = _decide(MAPPED, rows)
    assert decision.bookkeeping is not None
    [settled] = decision.bookkeeping.settled
    assert (settled.status, settled.output, settled.failed_items) == (
        "done", ["one", {"error": "node x: boom"}, "three"], (1,))
    [event] = decision.bookkeeping.events()
    assert event.payload["failed_items"] == [1] and event.parent_span_id == "m"


def test_a_map_over_a_value_that_is_not_a_list_fails_when_it_is_opened() -> None:
    flow = _flow([{"id": "each", "kind": "map", "over": "input.n", "on_error": "continue",
                   "body": {"nodes": [_tool("x")]}}])
    decision = _decide(flow, {})
    assert decision.bookkeeping is not None
    [opened] = decision.bookkeeping.opened
    assert opened.items is None and "is not a list" in opened.error and opened.output == {"error": opened.error}
    assert [e.type for e in decision.bookkeeping.events()] == ["flow.node.started", "flow.node.finished"]


def test_a_failed_node_ends_the_flow_with_its_error_and_a_bad_output_expression_fails_it() -> None:
    rows = {"a": Row("failed", error="502: upstream")}
    decision = _decide(CHAIN, rows)
    assert (decision.outcome, decision.failed_node) == ("failed", "a")
    assert flow_plan.ending(CHAIN, decision, rows, flow_input={}) == Ending(False, error="node a failed: 502: upstream")
    flow = _flow([_tool("a")], output="abs(nodes.a)")
    done = {"a": Row("done", output="text")}
    end = flow_plan.ending(flow, _decide(flow, done), done, flow_input={})
    assert not end.succeeded and end.error.startswith("node output (")


def test_a_view_makes_stale_and_redone_nodes_pending_and_counts_running_items() -> None:
    rows = {"each": Row("running", kind="map", inputs={"items": [1]}), "each[0].x": Row("running", lease_expires_at=LIVE),
            "after": Row("waiting")}
    seen = flow_plan.view(MAPPED, rows, NOW, redo=("after",))
    assert seen == View({"each": "running", "each[0].x": "running", "after": "pending"}, frozenset(), {}, [], 1)


def test_call_ids_and_summaries() -> None:
    assert flow_plan.call_id("12345678-1234-5678-1234-567812345678", "n") == "fl:12345678123456781234567812345678:n"
    assert flow_plan.summary("x" * 600) == "x" * 500 and flow_plan.summary({"a": 1}) == '{"a": 1}'
