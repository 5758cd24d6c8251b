"""The work an expression's shape allows, read from its tree (runtime/expression_cost.py): a bound on the steps the
evaluator counts (runtime/expressions.py) for any data, used to refuse at save an expression that passes the work
bound whatever its data."""

from __future__ import annotations

from typing import Any

import pytest

from runtime import expressions
from runtime.expression_cost import work


def steps(expression: str) -> int:
    return work(expressions.parse(expression).parsed)


def doubling(k: int) -> str:
    return "[input.a, input.b]" + " | [[@[0],@[0]],[@[1],@[1]]]" * k + " | @[0] == @[1]"


def values(data: Any) -> int:
    if isinstance(data, dict):
        return 1 + sum(values(v) for v in data.values())
    if isinstance(data, list):
        return 1 + sum(values(v) for v in data)
    return 1


def test_the_bound_of_compared_trees_doubles_with_each_step_that_repeats_its_data() -> None:
    for k in range(8, 20):
        assert 1.9 < steps(doubling(k + 1)) / steps(doubling(k)) < 2.1, k
    assert steps(doubling(15)) <= expressions.MAX_WORK < steps(doubling(16))
    assert steps("input.l[*]" + ".[@, @][*]" * 22) > expressions.MAX_WORK  # pairs projected in pairs
    assert steps("input.l[*]" + ".[@, @][*]" * 5) < 1000


def test_reading_different_parts_adds_them_up_as_the_parts_do() -> None:
    apart = steps("{a: x.a, b: x.b, c: x.c}" + " | {a: a, b: b, c: c}" * 20 + " | a == b")
    assert apart < 1000  # each step reads each part once: the work stays linear
    assert steps("x" + " | [@, @]" * 20 + " | @[0] == @[1]") > expressions.MAX_WORK  # each step reads all twice


@pytest.mark.parametrize("expression", [
    "input.order_id", "to_number(nodes.order.total) > `100`", "nodes.search.items[?price > `10`].{id: id, p: price}",
    "{carrier: nodes.logistics.carrier, big: nodes.big.total}", "sort_by(input.l[*].{v: @}, &v)[].v",
    "map(&(@ == `1`), input.l)", "contains(input.l, `2`)", "join(', ', input.names)", "input.l[0:2]", "*.l[]",
    "length(input.l) > `0` && input.x != 'no' || !input.y", "not_null(input.z, input.l) | merge({a: @[0]}, {b: `1`})",
])
def test_ordinary_expressions_stay_far_below_the_bound_and_above_what_they_take(expression: str) -> None:
    bound = steps(expression)
    assert bound < 100, bound
    data = {"input": {"order_id": "O1", "l": [1, 2, 3, 2], "names": ["a", "b"], "x": "yes", "z": None},
            "nodes": {"order": {"total": "259.00"}, "logistics": {"carrier": "SF"}, "big": {"total": 1},
                      "search": {"items": [{"id": i, "price": i * 5} for i in range(6)]}}}
    shared = expressions.Work()
    expressions.search(expression, data, shared)
    assert expressions.MAX_WORK - shared.left <= bound * values(data)
