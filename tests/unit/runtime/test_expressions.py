"""A flow's JMESPath expressions are evaluated within a size bound (runtime/expressions.py): an expression that
repeats its data after each ``|`` would make a value a billion times its input (the worker runs out of memory storing
it); it is refused with a message naming it instead. Each EXPLODING case is sized so that, unbounded, it makes about
100 MB (or a shared tree) and returns, so the test fails rather than exhausting memory; thirty steps more would not."""

from __future__ import annotations

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
    "a list that doubles": (_steps("input.l", "[@, @][]", 22), "makes more than 1000000 list items"),
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
    near = _steps("input.l", "[@, @][]", 16)  # each step's list counted twice (flattened, projected): ~786 000 made
    for _ in range(3):
        assert len(search(near, DATA)) == 3 * 2 ** 16
    assert expressions.MAX_MADE_ITEMS == 1_000_000


def test_what_is_made_on_the_way_counts_even_when_the_value_is_small() -> None:
    big = {"input": {"big": list(range(300_000))}}
    assert search("length(input.big)", big) == 300_000
    with pytest.raises(ValueTooLarge, match="makes more than 1000000 list items"):
        search("length(input.big[*].[@, @, @, @])", big)  # 1.2 M entries made, then counted down to one number
