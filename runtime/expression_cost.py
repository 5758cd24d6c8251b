"""How much work a JMESPath expression may do, read from its tree before it runs: the save-time half of the work
bound (``runtime/expressions.py`` counts the steps as it evaluates; this bounds them for any data, and
:func:`work_problem` refuses an expression whose bound is past ``MAX_WORK`` for the smallest data).

A bound is linear in the expression's data: ``Σ coefficient × size(the data's part at a path) + constant``, sizes
counted in JSON values (each object, list, string, number...), paths made of the fields and indexes read. Keeping
the paths makes reads of different parts add up as the parts do: ``{a: x.a, b: x.b}`` is at most one data's worth,
``[@, @]`` two, ``[[@[0], @[0]], [@[1], @[1]]]`` two as well. A step applied to the value of another multiplies by its
own factor, so an expression that repeats its data after every ``|`` grows 2 ** k in k steps, and comparing what it
built takes 2 ** k steps. :func:`work` is the bound for data of size one (every part read one value): the least any
data may cost by this bound, and already past ``MAX_WORK`` for such expressions.

The bound follows what the evaluator counts (each node evaluated, once per item of a projection; the items a
function reads; the pairs ``==`` walks) and errs upward (an ``||`` counts both sides' values, a filter every item).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from runtime import expressions

#: Figures stop growing here (an expression of 2,000 characters may multiply past any number worth writing).
CAP = 10**18

Path = tuple[Any, ...]


@dataclass(frozen=True)
class Bound:
    """``Σ parts[path] × size(data at path) + constant``."""

    parts: Mapping[Path, int] = field(default_factory=dict)
    constant: int = 0

    def peak(self) -> int:
        """The bound's factor over the data's size: the largest sum of coefficients along one path (a part holds its
        sub-parts, and parts beside each other share the data's size)."""
        return self._peak

    @cached_property
    def _peak(self) -> int:
        trie: dict[Any, Any] = {}
        for path, coefficient in self.parts.items():
            at = trie
            for step in path:
                at = at.setdefault(("part", step), {})
            at["coefficient"] = at.get("coefficient", 0) + coefficient
        best, stack = 0, [(trie, 0)]
        while stack:
            at, above = stack.pop()
            total = above + at.get("coefficient", 0)
            best = max(best, total)
            stack.extend((sub, total) for key, sub in at.items() if key != "coefficient")
        return min(best, CAP)

    def at_most(self) -> int:
        """The bound for data of size one."""
        return min(self.peak() + self.constant, CAP)


NOTHING = Bound()
ONE = Bound(constant=1)
WHOLE = Bound({(): 1})  # the value itself


def _add(*bounds: Bound) -> Bound:
    parts: dict[Path, int] = {}
    for bound in bounds:
        for path, coefficient in bound.parts.items():
            parts[path] = min(parts.get(path, 0) + coefficient, CAP)
    return Bound(parts, min(sum(b.constant for b in bounds), CAP))


def _scale(bound: Bound, factor: int) -> Bound:
    return Bound({p: min(c * factor, CAP) for p, c in bound.parts.items() if factor}, min(bound.constant * factor, CAP))


def _most(*bounds: Bound) -> Bound:
    """A bound of whichever of ``bounds`` holds (at most the largest coefficient of each part)."""
    parts: dict[Path, int] = {}
    for bound in bounds:
        for path, coefficient in bound.parts.items():
            parts[path] = max(parts.get(path, 0), coefficient)
    return Bound(parts, max((b.constant for b in bounds), default=0))


def _then(first: Bound, second: Bound) -> Bound:
    """``second`` (a bound over the value of a step whose size ``first`` bounds) over the step's own input."""
    if first.constant == 0 and len(first.parts) == 1 and next(iter(first.parts.values())) == 1:
        (path,) = first.parts  # a part of the data: what follows reads inside it
        return Bound({path + p: c for p, c in second.parts.items()}, second.constant)
    return _add(_scale(first, second.peak()), Bound(constant=second.constant))


def _each(items: Bound, per_item: Bound) -> Bound:
    """``per_item`` for every item of a list whose size ``items`` bounds (an item is at least one value)."""
    return _scale(items, min(per_item.peak() + per_item.constant, CAP))


def _values(literal: Any) -> int:
    if isinstance(literal, dict):
        return 1 + sum(_values(v) for v in literal.values())
    if isinstance(literal, list):
        return 1 + sum(_values(v) for v in literal)
    return 1


def work(ast: Mapping[str, Any]) -> int:
    """Steps an evaluation of the parsed expression ``ast`` may take over data of size one."""
    return _estimate(ast)[1].at_most()


def work_problem(expression: str) -> str | None:
    """Why ``expression`` is refused before it is saved: the work its shape allows passes ``MAX_WORK`` whatever its
    data; None when it does not (its data may still take it there, and then its evaluation stops). A
    ``JMESPathError`` when it does not parse."""
    steps = work(expressions.parse(expression).parsed)
    if steps <= expressions.MAX_WORK:
        return None
    figure = str(steps) if steps < 10**9 else f"2^{steps.bit_length() - 1} or more"
    return (f"takes up to {figure} steps of work (nodes evaluated, items read, pairs of values compared) per value "
            f"of its data, more than the {expressions.MAX_WORK} an evaluation may take; {expressions.WORK_ADVICE}, so "
            "rewrite it to select what the node needs")


#: Functions whose value is one number, string or boolean; the others' value is their arguments' size or less.
_SCALAR = frozenset({"abs", "avg", "ceil", "contains", "ends_with", "floor", "join", "length", "max", "min",
                     "starts_with", "sum", "to_number", "to_string", "type"})
#: Functions that apply an ``&expression`` to each item of their list argument: (the list's position, the exprefs').
_PER_ITEM = {"map": (1, 0), "sort_by": (0, 1), "min_by": (0, 1), "max_by": (0, 1)}


def _estimate(node: Mapping[str, Any]) -> tuple[Bound, Bound]:
    """``(size of the value, steps of work)`` of ``node`` over its input."""
    kind = node["type"]
    children = [c for c in node.get("children") or () if isinstance(c, dict)]
    rule = _RULES.get(kind)
    if rule is None:  # a kind this version does not know: all its children's values and work, and one step
        found = [_estimate(c) for c in children]
        size, steps = _add(ONE, *(s for s, _ in found)), _add(ONE, *(w for _, w in found))
    else:
        size, steps = rule(node, children)
    return size, _add(ONE, steps)  # the node itself: one step


def _leaf(node: Mapping[str, Any], children: list[Any]) -> tuple[Bound, Bound]:
    kind, value = node["type"], node.get("value")
    if kind == "field" or (kind == "index" and isinstance(value, int) and value >= 0):
        return Bound({(value,): 1}), NOTHING
    if kind == "literal":
        return Bound(constant=_values(value)), NOTHING
    if kind == "slice":
        return _add(ONE, WHOLE), NOTHING
    return WHOLE, NOTHING  # current, identity, a negative index: some of the value, or all of it


def _chain(node: Mapping[str, Any], children: list[Any]) -> tuple[Bound, Bound]:
    size, steps = WHOLE, NOTHING
    for child in children:
        child_size, child_steps = _estimate(child)
        steps = _add(steps, _then(size, child_steps))
        size = _then(size, child_size)
    return size, steps


def _projection(node: Mapping[str, Any], children: list[Any]) -> tuple[Bound, Bound]:
    (items, items_steps), (each, each_steps) = _estimate(children[0]), _estimate(children[1])
    steps = [items_steps, _each(items, each_steps)]
    if len(children) > 2:  # a filter: its condition for every item
        steps.append(_each(items, _estimate(children[2])[1]))
    return _add(ONE, _each(items, each)), _add(*steps)


def _flatten(node: Mapping[str, Any], children: list[Any]) -> tuple[Bound, Bound]:
    size, steps = _estimate(children[0])
    return _add(ONE, size), steps


def _comparator(node: Mapping[str, Any], children: list[Any]) -> tuple[Bound, Bound]:
    (left, left_steps), (right, right_steps) = _estimate(children[0]), _estimate(children[1])
    compared = _add(left, right) if node.get("value") in ("eq", "ne") else NOTHING
    return ONE, _add(left_steps, right_steps, compared)


def _either(node: Mapping[str, Any], children: list[Any]) -> tuple[Bound, Bound]:
    found = [_estimate(c) for c in children]
    return _most(*(s for s, _ in found)), _add(*(w for _, w in found))


def _not(node: Mapping[str, Any], children: list[Any]) -> tuple[Bound, Bound]:
    return ONE, _estimate(children[0])[1]


def _select(node: Mapping[str, Any], children: list[Any]) -> tuple[Bound, Bound]:
    found = [_estimate(c) for c in children]
    return _add(ONE, *(s for s, _ in found)), _add(*(w for _, w in found))


def _pass(node: Mapping[str, Any], children: list[Any]) -> tuple[Bound, Bound]:
    return _estimate(children[0])  # a key-value pair of a multi-select object, an &expression as such


def _function(node: Mapping[str, Any], children: list[Any]) -> tuple[Bound, Bound]:
    name = node.get("value")
    args = [(_estimate(c) if c["type"] != "expref" else (ONE, ONE)) for c in children]
    sizes = [s for s, _ in args]
    steps = [w for _, w in args]
    if name not in expressions.AT_ONCE:
        steps += sizes  # the items it reads
    if name == "contains" and len(sizes) == 2:
        steps.append(sizes[0])  # the pairs it compares: at most one per value of the list
    per_item = _PER_ITEM.get(str(name))
    size = _add(ONE, *sizes)
    if per_item is not None and len(children) == 2 and children[per_item[1]]["type"] == "expref":
        items = sizes[per_item[0]]
        each, each_steps = _estimate(children[per_item[1]]["children"][0])
        steps.append(_each(items, each_steps))
        size = _add(ONE, _each(items, each)) if name == "map" else _add(ONE, items)
    elif name in _SCALAR:
        size = ONE
    elif name == "not_null":
        size = _most(*sizes)
    return size, _add(*steps)


_Rule = Callable[[Mapping[str, Any], list[Any]], tuple[Bound, Bound]]
_RULES: dict[str, _Rule] = {
    **dict.fromkeys(("field", "index", "literal", "slice", "current", "identity"), _leaf),
    **dict.fromkeys(("subexpression", "pipe", "index_expression"), _chain),
    **dict.fromkeys(("projection", "value_projection", "filter_projection"), _projection),
    **dict.fromkeys(("or_expression", "and_expression"), _either),
    **dict.fromkeys(("multi_select_list", "multi_select_dict"), _select),
    **dict.fromkeys(("key_val_pair", "expref"), _pass),
    "flatten": _flatten,
    "comparator": _comparator,
    "not_expression": _not,
    "function_expression": _function,
}
