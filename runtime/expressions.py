"""A flow's JMESPath expressions (tenant input), evaluated within a size bound.

An expression of a few hundred characters can make a value far larger than its data: ``[@, @][]`` doubles a list,
``join('', [@, @])`` a string, and ``{a: @, b: @}`` a tree whose JSON doubles (the tree shares its halves in memory,
its JSON does not), each at every ``|``, and ``l[*].[@, @][*].[@, @][*]…`` nests new pairs at every step. Thirty
steps are a billion times the input: the worker runs out of memory (or time) making or storing it, and every worker
that picks the node up again does too. Here every list and object the evaluation makes (projections, multi-selects,
flattening, functions) and the strings ``join`` and ``to_string`` make count against one allowance per evaluation,
and the value is measured as JSON (stopping as soon as it is too large) before anyone stores or sends it. Past
either, ``ValueTooLarge``.

What an evaluation DOES is bounded too (``MAX_WORK`` steps): a value the evaluation makes may share its branches
(``[[@[0], @[0]], [@[1], @[1]]]`` after each ``|`` makes three short lists a step), so it stays small in memory while
comparing two of them (``==``, ``!=``, ``contains``) walks 2 ** k pairs: Python's ``==`` did that in C, holding the
GIL, for seconds at k = 29 and for centuries at k = 58. Here every node of the expression evaluated (once per item of
a projection, filter or ``map``) is a step, a function reads its arguments' items as steps, and a comparison first
counts the pairs it may walk (``equality_steps``, itself stopping at the steps left) before Python compares them.
Past the bound, ``ValueTooLarge`` naming the expression and the bound. An expression whose work grows past the bound
whatever its data is refused before it is saved (``runtime/expression_cost.py`` works that out from its tree).

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
#: Steps of work an evaluation may take: each node of the expression evaluated (once per item of a projection), each
#: item of a list or object a function reads, each pair of values ``==``/``!=``/``contains`` may compare. A step is
#: 0.3-2 µs of CPU (a pair compared - a node evaluated), so an evaluation holds its worker for half a second at most,
#: in Python steps between which other threads run; a condition over a list of 20,000 items takes about 100,000.
MAX_WORK = 250_000


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


#: Why an expression is refused for its work (here when it runs, in ``runtime/expression_cost`` when it is saved).
WORK_ADVICE = ("an expression that repeats its data after a | ([@, @], [[@[0], @[0]], [@[1], @[1]]]) doubles the work "
               "of what follows at every step, and one over a large list does its work once per item")
_GROWS = ("an expression that repeats its data ([@, @][], {a: @, b: @}, join('', [@, @]) after a |) grows it at "
           "every step")


def _too_large(expression: str, what: str, why: str = _GROWS) -> ValueTooLarge:
    shown = expression if len(expression) <= 80 else f"{expression[:80]}…"
    return ValueTooLarge(f"the expression {shown!r} {what}; {why}, so rewrite it to select what the node needs")


def equality_steps(left: Any, right: Any, limit: int) -> int:
    """The pairs of values ``left == right`` may compare, counted up to ``limit + 1`` (then it stops), without
    comparing them: lists of the same length and objects of the same size pair their items; anything else, and the
    same object twice, is one pair (Python looks no further). More than ``==`` compares when it meets a difference
    early, never fewer; a shared branch is counted each time it is reached, as ``==`` walks it each time."""
    steps = 0
    pairs = [(left, right)]
    while pairs:
        a, b = pairs.pop()
        steps += 1
        if steps > limit:
            break
        if a is b:
            continue
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            pairs.extend(zip(a, b, strict=True))
        elif isinstance(a, dict) and isinstance(b, dict) and len(a) == len(b):
            pairs.extend((value, b[key]) for key, value in a.items() if key in b)
    return steps


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


#: Functions that do not read their arguments' items (the others read, check or copy each: a step each).
AT_ONCE = frozenset({"length", "type", "not_null", "to_array", "abs", "ceil", "floor"})


class _Functions(functions.Functions):  # type: ignore[misc]  # jmespath has no types
    """JMESPath's functions, with ``join`` and ``to_string`` counting the characters they make, every function the
    items it reads as steps of work, and ``contains`` the pairs it compares."""

    def __init__(self, allowance: _Allowance) -> None:
        super().__init__()
        self.allowance = allowance

    def call_function(self, function_name: str, resolved_args: list[Any]) -> Any:
        if function_name not in AT_ONCE:
            self.allowance.spend_work(sum(len(arg) for arg in resolved_args if isinstance(arg, list | dict)))
        return super().call_function(function_name, resolved_args)

    @functions.signature({"types": ["array", "string"]}, {"types": []})  # type: ignore[untyped-decorator]
    def _func_contains(self, subject: Any, search: Any) -> bool:
        if isinstance(subject, list):
            for item in subject:
                self.allowance.spend_work(equality_steps(item, search, self.allowance.work))
        return bool(super()._func_contains(subject, search))

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


class Work:
    """Steps of work several evaluations share: a node's inputs, a prompt's fields, a switch's cases (a node may hold
    any number of expressions; each within the bound would not bound the node)."""

    def __init__(self) -> None:
        self.left = MAX_WORK


class _Allowance:
    def __init__(self, expression: str, shared: Work | None = None) -> None:
        self.expression = expression
        self.items = MAX_MADE_ITEMS
        self.chars = MAX_MADE_CHARS
        self.shared = shared
        self.work = MAX_WORK if shared is None else shared.left

    def exceeded(self, what: str) -> ValueTooLarge:
        return _too_large(self.expression, what)

    def spend_work(self, count: int) -> None:
        self.work -= count
        if self.work < 0:
            raise self.overworked()

    def overworked(self) -> ValueTooLarge:
        whose = " its node's expressions share" if self.shared is not None else ""
        return _too_large(self.expression, f"takes more than the {MAX_WORK} steps of work{whose} (nodes evaluated, "
                                           "items read, pairs of values compared)", WORK_ADVICE)

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


_EQUALS = TreeInterpreter.COMPARATOR_FUNC["eq"]


class _Interpreter(TreeInterpreter):  # type: ignore[misc]
    def __init__(self, allowance: _Allowance) -> None:
        super().__init__(jmespath.Options(custom_functions=_Functions(allowance)))
        self.allowance = allowance
        # the comparators the interpreter looks up: == and != count their pairs first, then compare as JMESPath does
        self.COMPARATOR_FUNC = {**TreeInterpreter.COMPARATOR_FUNC, "eq": self._equals,
                                "ne": lambda x, y: not self._equals(x, y)}

    def _equals(self, left: Any, right: Any) -> bool:
        self.allowance.spend_work(equality_steps(left, right, self.allowance.work))
        return bool(_EQUALS(left, right))

    def visit(self, node: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        allowance = self.allowance
        allowance.work -= 1
        if allowance.work < 0:
            raise allowance.overworked()
        value = super().visit(node, *args, **kwargs)
        if node["type"] in _MAKERS and isinstance(value, list | dict):
            self.allowance.spend_items(len(value))
        return value


def search(expression: str, data: Any, work: Work | None = None) -> Any:
    """``jmespath.search(expression, data)`` within the bounds; ``ValueTooLarge`` past them (JMESPath's own errors as
    they are). ``work``: the steps it shares with other evaluations (by default, ``MAX_WORK`` of its own)."""
    allowance = _Allowance(expression, work)
    try:
        value = _Interpreter(allowance).visit(parse(expression).parsed, data)
    finally:
        if work is not None:
            work.left = max(allowance.work, 0)
    if not json_size_within(value, MAX_VALUE_BYTES):
        raise _too_large(expression, f"gives a value larger than {MAX_VALUE_BYTES // (1024 * 1024)} MiB as JSON")
    return value
