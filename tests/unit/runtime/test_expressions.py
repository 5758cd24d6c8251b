"""A flow's JMESPath expressions are evaluated within a size bound (runtime/expressions.py): an expression that
repeats its data after each ``|`` would make a value a billion times its input (the worker runs out of memory storing
it); it is refused with a message naming it instead. Each EXPLODING case is sized so that, unbounded, it makes about
100 MB (or a shared tree) and returns, so the test fails rather than exhausting memory; thirty steps more would not."""

from __future__ import annotations

import time
from typing import Any

import jmespath
import pytest

from runtime import expressions
from runtime.expressions import ValueTooLarge, json_size_within, search
from runtime.flows import evaluate

DATA: dict[str, Any] = {"input": {"x": "y" * 100, "l": [1, 2, 3]}, "nodes": {"a": {"total": "259.00"}}}


def _steps(start: str, step: str, count: int) -> str:
    return "|".join([start] + [step] * count)


EXPLODING = {
    "a tree whose JSON doubles": (_steps("input", "{a: @, b: @}", 40), "larger than 2 MiB as JSON"),
    # ``[]`` projects what it flattens: evaluating every item (a step each) reaches the work bound first
    "a list that doubles": (_steps("input.l", "[@, @][]", 22), "takes more than the 250000 steps of work"),
    "pairs nested in pairs": ("input.l[*]" + ".[@, @][*]" * 22, "larger than 2 MiB as JSON"),
    "a string that doubles": (_steps("input.x", "join('', [@, @])", 20), "makes strings of more than"),
    "the tree written out": (_steps("input", "{a: @, b: @}", 18) + "|to_string(@)", "to_string"),
}


@pytest.mark.parametrize(("expression", "said"), EXPLODING.values(), ids=EXPLODING.keys())
def test_an_expression_that_repeats_its_data_is_refused_naming_it(expression: str, said: str) -> None:
    with pytest.raises(ValueTooLarge) as caught:
        search(expression, DATA)
    assert said in str(caught.value) and expression[:40] in str(caught.value)
    assert "rewrite it to select what the node needs" in str(caught.value)
    with pytest.raises(ValueError):  # what the runner catches: the node fails with the message
        evaluate(expression, DATA)


@pytest.mark.parametrize("expression", [
    "input.x", "input.l[?@ > `1`]", "to_string(input)", "join(',', ['a', 'b'])", "to_number(nodes.a.total) > `100`",
    "{order: nodes.a, items: input.l}", "input.l[*].to_string(@)", "[input.l, input.l][]", "sort(input.l)",
    "missing.path", "length(input.x)",
])
def test_ordinary_expressions_give_what_jmespath_gives(expression: str) -> None:
    assert search(expression, DATA) == jmespath.search(expression, DATA)


def test_a_large_value_from_the_data_itself_passes_up_to_the_bound() -> None:
    big = {"input": {"rows": ["r" * 1000] * 1500}}  # 1.5 MB of JSON
    assert len(search("input.rows", big)) == 1500
    assert len(search("input.rows[]", big)) == 1500  # flattening counts items, not bytes
    with pytest.raises(ValueTooLarge):
        search("[input.rows, input.rows][]", big)  # 3 MB


def test_the_json_size_check_stops_early_and_counts_shared_branches_as_json_does() -> None:
    leaf = {"k": "v" * 10}
    tree: Any = leaf
    for _ in range(60):  # 2 ** 60 leaves as JSON; a few dozen objects in memory
        tree = {"a": tree, "b": tree}
    assert not json_size_within(tree, 10_000)
    assert json_size_within(leaf, 100) and not json_size_within(leaf, 10)
    assert json_size_within(["x" * 10] * 3, 2 + 3 + 36)


def test_each_evaluation_has_its_own_allowance() -> None:
    # each step's list counted twice (flattened, projected): ~393 000 items made, ~197 000 steps of work
    near = _steps("input.l", "[@, @][]", 15)
    for _ in range(3):
        assert len(search(near, DATA)) == 3 * 2 ** 15
    assert expressions.MAX_MADE_ITEMS == 1_000_000


def test_what_is_made_on_the_way_counts_even_when_the_value_is_small() -> None:
    big = {"input": {"big": list(range(300_000))}}
    assert search("length(input.big)", big) == 300_000
    with pytest.raises(ValueTooLarge, match="makes more than 1000000 list items"):
        # 1.2 M entries made by flattening (a few steps of work), then counted down to one number
        search("length([input.big, input.big, input.big, input.big][])", big)
    with pytest.raises(ValueTooLarge, match="steps of work"):  # by a projection: 1.5 M nodes evaluated first
        search("length(input.big[*].[@, @, @, @])", big)


# -- work: what an evaluation does, not only what it makes (issue #49) ----------------------------------------


def bomb(k: int) -> str:
    """The issue's switch ``when``: two trees that share their branches, 2 ** k leaves each, then compared. Making them
    costs nothing (each step makes three short lists); comparing them takes 2 ** k steps, which Python's ``==`` did in
    C with the GIL held (k = 29: 15 s; k = 58: centuries)."""
    return "[input.a, input.b]" + " | [[@[0],@[0]],[@[1],@[1]]]" * k + " | @[0] == @[1]"


@pytest.mark.parametrize("k", [29, 58])
def test_comparing_values_built_by_repeating_the_data_stops_at_the_work_bound_naming_the_expression(k: int) -> None:
    expression = bomb(k)
    began = time.thread_time()  # this thread's CPU: the bound is on work, whatever else the machine runs
    with pytest.raises(ValueTooLarge) as caught:
        search(expression, {"input": {"a": [1], "b": [1]}})
    assert time.thread_time() - began < 2.0  # unbounded, k=29 took 38 s and k=58 never ended
    said = str(caught.value)
    assert expression[:40] in said and f"more than the {expressions.MAX_WORK} steps of work" in said, said


def test_contains_over_built_values_counts_its_comparisons() -> None:
    shared = "[input.a, input.b]" + " | [[@[0],@[0]],[@[1],@[1]]]" * 24
    began = time.thread_time()
    with pytest.raises(ValueTooLarge, match="steps of work"):
        search(f"{shared} | contains([@[0]], @[1])", {"input": {"a": [1], "b": [1]}})
    assert time.thread_time() - began < 2.0


def test_evaluating_an_expression_over_every_item_counts_even_when_it_makes_nothing() -> None:
    """A filter that holds for no item makes an empty list, but evaluates its condition (50 comparisons, some 250
    nodes) for each of 2,000 items: half a million steps."""
    condition = " || ".join(["abs(@) == `-1`"] * 50)
    expression = f"input.l[?{condition}]"
    data = {"input": {"l": list(range(2000))}}
    with pytest.raises(ValueTooLarge, match="steps of work"):
        search(expression, data)
    assert search(expression, {"input": {"l": list(range(200))}}) == []  # the same over 200 items: some 50,000 steps


def test_equality_steps_are_counted_without_comparing_and_stop_at_the_limit() -> None:
    a: Any = [1]
    b: Any = [1]
    for _ in range(60):  # 2 ** 60 leaves each, sharing their branches: a few dozen lists in memory
        a, b = [a, a], [b, b]
    began = time.thread_time()
    assert expressions.equality_steps(a, b, 1000) == 1001
    assert time.thread_time() - began < 0.5
    assert expressions.equality_steps([1, 2, 3], [1, 2, 3], 1000) == 4
    assert expressions.equality_steps({"k": [1, 2]}, {"k": [1, 2]}, 1000) == 4
    assert expressions.equality_steps([1, 2], [1, 2, 3], 1000) == 1  # lengths differ: == looks no further
    assert expressions.equality_steps(a, a, 1000) == 1  # the same object: == does not look inside


@pytest.mark.parametrize("expression", [
    "input.l == input.l", "[`0`] == [`false`]", "`1` == `true`", "input.l != [`1`, `2`, `3`]",
    "contains(input.l, `2`)", "contains(input.x, 'yy')", "nodes.a == {total: '259.00'}", "{a: nodes.a} == {a: nodes.a}",
    "input.l[?@ != `2`]", "sort_by(input.l[*].{v: @}, &v)[].v", "map(&(@ == `1`), input.l)",
])
def test_comparisons_give_what_jmespath_gives(expression: str) -> None:
    assert search(expression, DATA) == jmespath.search(expression, DATA)
