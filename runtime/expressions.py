"""A flow's JMESPath expressions (tenant input), evaluated within a size bound.

An expression of a few hundred characters can make a value far larger than its data: ``[@, @][]`` doubles a list,
``join('', [@, @])`` a string, and ``{a: @, b: @}`` a tree whose JSON doubles (the tree shares its halves in memory,
its JSON does not), each at every ``|``, and ``l[*].[@, @][*].[@, @][*]…`` nests new pairs at every step. Thirty
steps are a billion times the input: the worker runs out of memory (or time) making or storing it, and every worker
that picks the node up again does too. Here every list and object the evaluation makes (projections, multi-selects,
flattening, functions) and the strings ``join`` and ``to_string`` make count against one allowance per evaluation,
and the value is measured as JSON (stopping as soon as it is too large) before anyone stores or sends it. Past
either, ``ValueTooLarge``.

An expression nested past ``MAX_DEPTH`` (``((((…))))``, ``!!!!…``, ``a | b | c | …`` a thousand times; a field
chain ``a.b.c`` is one level) is refused when it is parsed (``parse``): the parser, the checks that walk the tree and
the evaluator all recurse, and such an expression would exhaust Python's stack in any of them.
"""

from __future__ import annotations

from typing import Any

import jmespath
from jmespath import functions
from jmespath.exceptions import JMESPathError
from jmespath.parser import ParsedResult
from jmespath.visitor import TreeInterpreter

#: The largest value an expression may give, as JSON (roughly: the size of its strings, keys and punctuation).
MAX_VALUE_BYTES = 2 * 1024 * 1024
#: List items and object entries an evaluation may make (projections, multi-selects, flattening, functions), and
#: characters ``join``/``to_string`` may make.
MAX_MADE_ITEMS = 1_000_000
MAX_MADE_CHARS = MAX_VALUE_BYTES


#: How deep an expression's tree may nest (``nodes.a.b[0].c > `1` && !d`` is 5 deep).
MAX_DEPTH = 64


class TooDeep(JMESPathError):  # type: ignore[misc]  # jmespath ships no types
    """An expression nested deeper than ``MAX_DEPTH`` (a ``JMESPathError``: it is refused where a malformed one is)."""


def parse(expression: str) -> ParsedResult:
    """``jmespath.compile(expression)``, refusing with ``TooDeep`` an expression nested past ``MAX_DEPTH``."""
    too_deep = TooDeep(f"it nests deeper than {MAX_DEPTH} levels (parentheses, brackets, ! and | chains); "
                       "split it or select less at once")
    try:
        parsed = jmespath.compile(expression)
    except RecursionError:
        raise too_deep from None
    stack = [(parsed.parsed, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise too_deep
        stack.extend((child, depth + 1) for child in node.get("children") or () if isinstance(child, dict))
    return parsed


class ValueTooLarge(ValueError):
    """An expression whose value (or a value made on the way) is larger than the bound."""


def _too_large(expression: str, what: str) -> ValueTooLarge:
    shown = expression if len(expression) <= 80 else f"{expression[:80]}…"
    return ValueTooLarge(f"the expression {shown!r} {what}; an expression that repeats its data ([@, @][], "
                         "{a: @, b: @}, join('', [@, @]) after a |) grows it at every step, so rewrite it to select "
                         "what the node needs")


def json_size_within(value: Any, limit: int) -> bool:
    """Whether ``value``'s JSON is at most about ``limit`` bytes; stops as soon as it is not (a tree that shares its
    branches is measured as its JSON would be, without writing it)."""
    left = limit
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            left -= 2 + sum(len(str(k)) + 4 for k in item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            left -= 2 + len(item)
            stack.extend(item)
        elif isinstance(item, str):
            left -= len(item) + 2
        else:
            left -= 8
        if left < 0:
            return False
    return True


class _Functions(functions.Functions):  # type: ignore[misc]  # jmespath has no types
    """JMESPath's functions, with ``join`` and ``to_string`` counting the characters they make."""

    def __init__(self, allowance: _Allowance) -> None:
        super().__init__()
        self.allowance = allowance

    @functions.signature({"types": []})  # type: ignore[untyped-decorator]
    def _func_to_string(self, arg: Any) -> str:
        if isinstance(arg, str):
            return arg
        if not json_size_within(arg, self.allowance.chars):
            raise self.allowance.exceeded("makes a string (to_string) larger than the bound")
        text = super()._func_to_string(arg)
        self.allowance.spend_chars(len(text))
        return str(text)

    @functions.signature({"types": ["string"]}, {"types": ["array-string"]})  # type: ignore[untyped-decorator]
    def _func_join(self, separator: str, array: list[str]) -> str:
        size = len(separator) * max(len(array) - 1, 0) + sum(len(s) for s in array)
        self.allowance.spend_chars(size)
        return separator.join(array)


class _Allowance:
    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.items = MAX_MADE_ITEMS
        self.chars = MAX_MADE_CHARS

    def exceeded(self, what: str) -> ValueTooLarge:
        return _too_large(self.expression, what)

    def spend_chars(self, count: int) -> None:
        self.chars -= count
        if self.chars < 0:
            raise self.exceeded(f"makes strings of more than {MAX_MADE_CHARS} characters")

    def spend_items(self, count: int) -> None:
        self.items -= count
        if self.items < 0:
            raise self.exceeded(f"makes more than {MAX_MADE_ITEMS} list items and object entries")


#: The nodes whose value is a list or object made during the evaluation (the others hand on a part of the data).
_MAKERS = frozenset({"flatten", "multi_select_list", "multi_select_dict", "projection", "value_projection",
                     "filter_projection", "slice", "function_expression"})


class _Interpreter(TreeInterpreter):  # type: ignore[misc]
    def __init__(self, allowance: _Allowance) -> None:
        super().__init__(jmespath.Options(custom_functions=_Functions(allowance)))
        self.allowance = allowance

    def visit(self, node: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        value = super().visit(node, *args, **kwargs)
        if node["type"] in _MAKERS and isinstance(value, list | dict):
            self.allowance.spend_items(len(value))
        return value


def search(expression: str, data: Any) -> Any:
    """``jmespath.search(expression, data)`` within the bounds; ``ValueTooLarge`` past them (JMESPath's own errors as
    they are)."""
    allowance = _Allowance(expression)
    value = _Interpreter(allowance).visit(parse(expression).parsed, data)
    if not json_size_within(value, MAX_VALUE_BYTES):
        raise _too_large(expression, f"gives a value larger than {MAX_VALUE_BYTES // (1024 * 1024)} MiB as JSON")
    return value
