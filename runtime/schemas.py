"""A tenant's JSON Schemas (tool arguments, a flow's ``input_schema``, a plugin's settings): what is refused at save
and how an instance is checked against one.

At save, a schema may reference only itself (``outside_references``): jsonschema resolves no other document, so a
``$ref`` to one would fail every check later; and its patterns must compile within bounds (``pattern_problems``).
A check (``problems_of``) runs inside one time budget: its patterns match on the bounded engine
(``runtime/patterns.py``), and every keyword checks the budget before it applies, because a schema needs no pattern
to be slow (``anyOf`` branches that descend into each other through a ``$ref`` cost branches ** depth: a forty-byte
nested list can take hours). Past the budget, or when a reference does not resolve, ``CheckError`` says what;
callers turn it into a problem for the caller or the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import ValidationError
from referencing.exceptions import Unresolvable

from runtime import patterns
from runtime.patterns import BUDGET_SECONDS, CheckError

__all__ = ["CheckError", "SchemaTooSlow", "outside_references", "pattern_problems", "problems_of", "validator"]


class SchemaTooSlow(CheckError):
    """A schema check that ran out of its budget (nested ``anyOf``/``oneOf``/``$ref``, many slow patterns, …)."""

    def __init__(self) -> None:
        super().__init__(f"the check against the schema took longer than its {BUDGET_SECONDS * 1000:g} ms: branches "
                         "(anyOf, oneOf, $ref) that descend into each other, or slow patterns, make it too slow for "
                         "this value, and the schema must be simplified")


def _on_budget(keyword: Callable[..., Any]) -> Callable[..., Any]:
    def apply(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        if patterns.spent():
            raise SchemaTooSlow()
        return keyword(validator, value, instance, schema)

    return apply


#: Draft 2020-12 with every keyword checking the budget before it applies.
_Bounded = validators.extend(
    Draft202012Validator, {name: _on_budget(keyword) for name, keyword in Draft202012Validator.VALIDATORS.items()})


def validator(schema: Any, format_checker: FormatChecker | None = None) -> Any:
    """A Draft 2020-12 validator whose patterns match within the time bound and which stops when the budget is spent;
    use it inside ``patterns.budget()`` and catch ``CheckError`` (``problems_of`` does both)."""
    patterns.guard_jsonschema()
    return _Bounded(schema, format_checker=format_checker)


def problems_of(schema: Any, instance: Any, format_checker: FormatChecker | None = None) -> list[ValidationError]:
    """Every way ``instance`` fails ``schema``, found within one budget; ``CheckError`` when the check cannot be made
    (too slow, a pattern that does not compile, a reference that does not resolve)."""
    try:
        with patterns.budget():
            return list(validator(schema, format_checker).iter_errors(instance))
    except Unresolvable as exc:  # jsonschema's wrapper of it too
        raise CheckError(f"a reference in the schema does not resolve ({exc}); only references within the schema "
                         "(#/...) work") from None


def pattern_problems(schema: Any) -> list[tuple[list[str | int], str]]:
    """Why a ``pattern`` or a ``patternProperties`` key in ``schema`` cannot be used (at save: refuse it), each with
    where it is (``(["properties", "order_id", "pattern"], "is too large a regular expression: ...")``)."""
    found: list[tuple[list[str | int], str]] = []

    def walk(node: Any, where: list[str | int]) -> None:
        if isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, [*where, index])
            return
        if not isinstance(node, dict):
            return
        if isinstance(node.get("pattern"), str) and (problem := patterns.compile_problem(node["pattern"])):
            found.append(([*where, "pattern"], problem))
        if isinstance(node.get("patternProperties"), dict):
            for key in node["patternProperties"]:
                if problem := patterns.compile_problem(str(key)):
                    found.append(([*where, "patternProperties"], problem))
        for key, value in node.items():
            if key != "pattern":
                walk(value, [*where, key])

    walk(schema, [])
    return found


def outside_references(schema: Any) -> list[str]:
    """Every ``$ref`` / ``$dynamicRef`` in ``schema`` that names another document (at save: refuse them)."""
    return [f"{key} {ref!r}" for key, ref in _references(schema) if not ref.startswith("#")]


def _references(node: Any) -> list[tuple[str, str]]:
    if isinstance(node, list):
        return [r for item in node for r in _references(item)]
    if not isinstance(node, dict):
        return []
    own = [(k, str(v)) for k, v in node.items() if k in ("$ref", "$dynamicRef")]
    return own + [r for v in node.values() for r in _references(v)]
