"""A tenant's JSON Schemas (tool arguments, a flow's ``input_schema``, a plugin's settings): what is refused at save
and how an instance is checked against one.

At save, a schema must be one (``invalid``) of a size a person writes (at most ``MAX_SUBSCHEMAS`` objects and
``MAX_PATTERNS`` distinct patterns: checking a schema costs about half a millisecond per object and compiling a
pattern about a third, so a 2 MB body of 40,000 properties held a server for half a minute), may reference only
itself (jsonschema resolves no other document, so a ``$ref`` to one would fail every check later) and its patterns
must compile within bounds (``unsafe_parts``).
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
from jsonschema.exceptions import SchemaError, ValidationError
from referencing.exceptions import Unresolvable

from runtime import patterns
from runtime.patterns import BUDGET_SECONDS, CheckError

__all__ = ["CheckError", "Located", "SchemaTooSlow", "invalid", "problems_of", "unsafe_parts", "validator"]


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


#: Where a problem is in a schema (``["properties", "order_id", "pattern"]``), and what it is.
Located = tuple[list[str | int], str]


#: The most objects (subschemas, their ``properties`` maps, …) and distinct patterns a schema may hold.
MAX_SUBSCHEMAS = 1000
MAX_PATTERNS = 200


def invalid(schema: Any) -> Located | None:
    """Why ``schema`` is not a JSON Schema (Draft 2020-12) at all, or is larger than one is written, and where; or
    None."""
    if (too_large := _too_large(schema)) is not None:
        return [], too_large
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return list(exc.absolute_path), f"not a valid JSON Schema: {exc.message}"
    return None


def unsafe_parts(schema: Any) -> list[Located]:
    """What in a valid schema cannot be used (at save: refuse it): a ``$ref``/``$dynamicRef`` that names another
    document (reported at the top), a ``pattern`` or a ``patternProperties`` key that does not compile within
    bounds (with where it is)."""
    refs: list[Located] = []
    found: list[Located] = []
    for where, node in _objects(schema, []):
        refs += [([], f"{key} {str(node[key])!r} points outside the schema; only references within it (#/...) are "
                      "allowed") for key in ("$ref", "$dynamicRef") if key in node and not str(node[key]).startswith("#")]
        if isinstance(node.get("pattern"), str) and (problem := patterns.compile_problem(node["pattern"])):
            found.append(([*where, "pattern"], problem))
        if isinstance(node.get("patternProperties"), dict):
            found += [([*where, "patternProperties"], problem) for key in node["patternProperties"]
                      if (problem := patterns.compile_problem(str(key)))]
    return refs + sorted(found, key=lambda located: [str(p) for p in located[0]])


def _too_large(schema: Any) -> str | None:
    """Why a schema is larger than ``MAX_SUBSCHEMAS``/``MAX_PATTERNS`` allow; None if it is not. Stops counting as
    soon as it is."""
    objects, found = 0, set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            objects += 1
            if objects > MAX_SUBSCHEMAS:
                return (f"has more than {MAX_SUBSCHEMAS} objects; a schema that large is generated, not written: "
                        "describe the arguments a person or a model fills in, and check the rest in the tool")
            if isinstance(node.get("pattern"), str):
                found.add(node["pattern"])
            if isinstance(node.get("patternProperties"), dict):
                found.update(str(key) for key in node["patternProperties"])
            if len(found) > MAX_PATTERNS:
                return f"has more than {MAX_PATTERNS} distinct patterns; reuse one through a $defs entry and $ref"
            stack.extend(node.values())
    return None


def _objects(node: Any, where: list[str | int]) -> list[tuple[list[str | int], dict[str, Any]]]:
    """Every object in a schema, with its path (a ``pattern`` value is a string, never an object)."""
    if isinstance(node, list):
        return [found for index, item in enumerate(node) for found in _objects(item, [*where, index])]
    if not isinstance(node, dict):
        return []
    return [(where, node), *(found for key, value in node.items() for found in _objects(value, [*where, key]))]
