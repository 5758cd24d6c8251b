"""Typed documents: the one way a JSON document an operator writes is checked, defaulted and read.

A document (an agent version's policy, a tool kind's config, a plugin manifest, a provider's model
table...) is a :class:`Document`: a frozen pydantic model whose fields carry their defaults, whose
leaf types are the ones below, and whose JSON Schema (``Model.model_json_schema()``) is what the
admin editor and the OpenAPI schema show. :func:`parse` validates once and returns the typed object;
code reads attributes, never ``doc["limits"][...]``. :func:`problems` reports every problem at once,
each as ``path: what is wrong[, got value]`` — the field path, what was wrong and what is expected.

Leaf types say what they expect in words (``must be a positive integer or null``), because the errors
are read by operators and, through the API, by client apps; pydantic's own messages are translated for
the few structural cases (an object expected, an unknown field). A check that needs more than one field
(or a table of installed extensions, via ``context``) is a validator on the model raising
:func:`problem` or :func:`problems_of`; paths in those are relative to the model (``$`` stands for it).

Pure: pydantic only, so the runtime core may use it.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError
from pydantic_core import PydanticCustomError, core_schema

__all__ = [
    "Document",
    "DocumentError",
    "Flag",
    "Leaf",
    "Names",
    "choice",
    "field_rows",
    "flag",
    "integer",
    "json_list",
    "json_object",
    "json_schema",
    "names",
    "number",
    "openapi_schema",
    "parse",
    "pattern",
    "problem",
    "problems",
    "problems_of",
    "text",
]

D = TypeVar("D", bound="Document")
_NOTHING = object()
#: Stands for the path of the model (or field) a validator reports about.
HERE = "$"


class Document(BaseModel):
    """A typed JSON document: unknown fields refused, frozen once parsed."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=False, hide_input_in_errors=False)

    def to_json(self) -> dict[str, Any]:
        """The complete document (every default filled in), as stored."""
        return self.model_dump(mode="json")


class DocumentError(ValueError):
    """A document is invalid; ``errors`` lists every problem as ``path: what is wrong``."""

    def __init__(self, errors: Sequence[str], what: str = "document") -> None:
        self.errors = list(errors)
        super().__init__(f"invalid {what}:\n" + "\n".join(f"- {e}" for e in self.errors))


# --- reporting -----------------------------------------------------------------------------------------------


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _got(value: Any) -> str:
    if value is _NOTHING:
        return ""
    return f", got {type_name(value)}" if isinstance(value, dict | list) else f", got {value!r}"


def problem(message: str, value: Any = _NOTHING, *, at: str = "") -> PydanticCustomError:
    """An error for a validator to raise: ``message`` about the field (or ``at``, a path below it)."""
    return problems_of([f"{HERE}{at}: {message}{_got(value)}"])


def problems_of(found: Iterable[str]) -> PydanticCustomError:
    """Several ``$path: message`` problems found by a checker of a sub-document, raised as one error."""
    listed = list(found)
    return PydanticCustomError("problems", "{count} problems", {"count": len(listed), "problems": listed})


def _path(base: str, loc: Sequence[int | str]) -> str:
    out = base
    for part in loc:
        if part == "[key]":  # a dict's key was wrong: the path is the key itself
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _join(path: str, relative: str) -> str:
    """``$`` in a validator's message replaced by the path of the field it was raised for."""
    rest = relative[len(HERE):] if relative.startswith(HERE) else relative
    if rest.startswith("."):
        return f"{path}{rest}" if path else rest[1:]
    if rest.startswith("["):
        return f"{path}{rest}"
    if rest.startswith(":"):
        return f"{path or 'document'}{rest}"
    return f"{path}: {rest}" if path else rest


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
            annotation = models[0] if models else members[0] if len(members) == 1 else annotation
            if not models and len(members) != 1:
                return annotation
        else:
            return annotation


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
            continue
        origin, args = typing.get_origin(current), typing.get_args(current)
        if origin in (dict, Mapping) and len(args) == 2:
            current = args[1]
        elif origin in (list, tuple, Sequence) and args:
            current = args[0]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _messages(model: type[BaseModel], error: ValidationError, base: str) -> list[str]:
    found: list[str] = []
    for item in error.errors(include_url=False):
        loc, kind, value = tuple(item["loc"]), item["type"], item.get("input", _NOTHING)
        path = _path(base, loc)
        if kind == "problems":
            found += [_join(path, p) for p in item["ctx"]["problems"]]
        elif kind == "invalid":
            found.append(f"{path}: {item['msg']}{_got(value)}")
        elif kind == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            expected = sorted(parent.model_fields) if parent else []
            found.append(f"{path}: unknown field; expected one of {expected}")
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            found.append(f"{path or 'document'}: must be an object{_got(value)}")
        elif kind in ("list_type", "tuple_type"):
            found.append(f"{path}: must be a list{_got(value)}")
        elif kind == "missing":
            parent = _model_at(model, loc[:-1])
            field = parent.model_fields.get(str(loc[-1])) if parent and loc else None
            said = f" ({field.description})" if field is not None and field.description else ""
            found.append(f"{path}: is required{said}")
        else:
            found.append(f"{path}: {item['msg'][:1].lower()}{item['msg'][1:]}{_got(value)}")
    return found


def problems(model: type[D], data: Any, *, path: str = "", context: Mapping[str, Any] | None = None) -> tuple[D | None, list[str]]:
    """``(document, [])`` when ``data`` is valid, else ``(None, every problem)``; paths start at ``path``."""
    try:
        return model.model_validate(data, context=dict(context or {})), []
    except ValidationError as exc:
        return None, _messages(model, exc, path)


def parse(model: type[D], data: Any, *, path: str = "", context: Mapping[str, Any] | None = None, what: str = "document") -> D:
    """The typed document; raises :class:`DocumentError` listing every problem."""
    document, found = problems(model, data, path=path, context=context)
    if found:
        raise DocumentError(found, what)
    assert document is not None
    return document


def _openapi30(node: Any) -> Any:
    if isinstance(node, list):
        return [_openapi30(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _openapi30(v) for k, v in node.items()}
    for bound, side in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), int | float) and not isinstance(out[bound], bool):  # 3.0: a flag on minimum/maximum
            out[side], out[bound] = out[bound], True
    options = out.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options and len(options) == 2:
        rest = {k: v for k, v in out.items() if k != "anyOf"}
        out = {**next(o for o in options if o != {"type": "null"}), **rest, "nullable": True}
    if "const" in out:
        out["enum"] = [out.pop("const")]
    return out


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema, inlined, in OpenAPI 3.0 terms (``nullable``, boolean ``exclusiveMinimum``, no
    ``const``), for drf-spectacular."""
    return _openapi30(json_schema(model))  # type: ignore[no-any-return]


# --- leaf types: a check with its wording, and its JSON Schema ----------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    """The check of one leaf field, in words, and its JSON Schema: ``Annotated[int | None, integer(nullable=True)]``."""

    check: Callable[[Any], Any]
    schema: dict[str, Any]
    nullable: bool = False

    def validate(self, value: Any) -> Any:
        return None if value is None and self.nullable else self.check(value)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.validate)

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {"anyOf": [self.schema, {"type": "null"}]} if self.nullable else dict(self.schema)


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid", message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(minimum: int = 1, *, nullable: bool = False, maximum: int | None = None) -> Leaf:
    """An integer of at least ``minimum`` (``must be a positive integer`` for 1), and at most ``maximum``."""
    kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if maximum is not None:
        kind = f"an integer from {minimum} to {maximum}"
    message = f"must be {kind}{' or null' if nullable else ''}"

    def check(value: Any) -> int:
        if not _is_int(value) or value < minimum or (maximum is not None and value > maximum):
            raise _invalid(message)
        return int(value)

    schema: dict[str, Any] = {"type": "integer", "minimum": minimum, **({"maximum": maximum} if maximum is not None else {})}
    return Leaf(check, schema, nullable)


def number(*, nullable: bool = True, maximum: float | None = None, minimum: float | None = None) -> Leaf:
    """A number above 0 (or, with ``minimum``, of at least ``minimum``), and at most ``maximum``."""
    upper = f" and at most {maximum}" if maximum is not None else ""
    lower = "above 0" if minimum is None else f">= {minimum:g}"
    message = f"must be a number {lower}{upper}{' or null' if nullable else ''}"

    def check(value: Any) -> float | int:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _invalid(message)
        if maximum is not None and value > maximum:
            raise _invalid(message)
        if value < minimum if minimum is not None else value <= 0:
            raise _invalid(message)
        return value

    schema: dict[str, Any] = {"type": "number", **({"exclusiveMinimum": 0} if minimum is None else {"minimum": minimum})}
    if maximum is not None:
        schema["maximum"] = maximum
    return Leaf(check, schema, nullable)


def choice(*options: str, nullable: bool = False) -> Leaf:
    """One of ``options``."""
    message = f"must be one of {list(options)}{' or null' if nullable else ''}"

    def check(value: Any) -> str:
        if value not in options:
            raise _invalid(message)
        return str(value)

    return Leaf(check, {"type": "string", "enum": list(options)}, nullable)


def text(*, nullable: bool = True, example: str = "") -> Leaf:
    """A non-empty string (``null`` allowed unless ``nullable=False``)."""
    message = f"must be a non-empty string{' or null' if nullable else ''}{f', e.g. {example}' if example else ''}"

    def check(value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _invalid(message)
        return value

    return Leaf(check, {"type": "string", "minLength": 1}, nullable)


def pattern(regex: str, message: str, *, nullable: bool = False) -> Leaf:
    """A string matching ``regex``; ``message`` says what is expected (``must be "provider/model", e.g. …``)."""
    compiled = re.compile(regex)

    def check(value: Any) -> str:
        if not isinstance(value, str) or not compiled.match(value):
            raise _invalid(message)
        return value

    return Leaf(check, {"type": "string", "pattern": regex}, nullable)


def json_object(message: str, schema: dict[str, Any] | None = None, *, nullable: bool = False) -> Leaf:
    """A JSON object kept as a dict (a sub-document checked by a validator on the owning model)."""

    def check(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _invalid(message)
        return value

    return Leaf(check, schema or {"type": "object"}, nullable)


def json_list(message: str, schema: dict[str, Any] | None = None) -> Leaf:
    """A JSON list kept as it is (its entries checked by a validator on the owning model)."""

    def check(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise _invalid(message)
        return value

    return Leaf(check, schema or {"type": "array"})


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _invalid("must be true or false")
    return value


def _names(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _invalid("must be a list of non-empty strings")
    return list(value)


def flag(*, nullable: bool = False) -> Leaf:
    """``true`` or ``false`` (``null`` too when ``nullable``: e.g. an override left unset)."""
    return Leaf(_flag, {"type": "boolean"}, nullable)


def names(*, nullable: bool = False) -> Leaf:
    """A list of non-empty strings (``null`` too when ``nullable``)."""
    return Leaf(_names, {"type": "array", "items": {"type": "string", "minLength": 1}}, nullable)


Flag = Annotated[bool, flag()]
Names = Annotated[list[str], names()]


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema with every ``$ref`` inlined: one self-contained object for OpenAPI and the admin."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                target = inline(defs[ref.rsplit("/", 1)[1]])
                return {**target, **{k: inline(v) for k, v in node.items() if k != "$ref"}}
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    schema: dict[str, Any] = inline(raw)
    return schema


def field_rows(schema: Mapping[str, Any], path: str = "") -> list[tuple[str, str, Any]]:
    """``(path, what it takes, default)`` for every leaf of an inlined schema: the admin editor's field table."""
    properties = schema.get("properties")
    if isinstance(properties, dict) and properties:
        rows: list[tuple[str, str, Any]] = []
        for name, sub in properties.items():
            rows += field_rows(sub, f"{path}.{name}" if path else name)
        return rows
    return [(path, _describe(schema), schema.get("default"))]


def _describe(schema: Mapping[str, Any]) -> str:
    if "anyOf" in schema:
        return " or ".join(_describe(s) for s in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    if "const" in schema:
        return repr(schema["const"])
    kind = str(schema.get("type", "any"))
    if kind == "integer" and "minimum" in schema:
        upper = schema.get("maximum")
        return f"integer from {schema['minimum']} to {upper}" if upper is not None else f"integer >= {schema['minimum']}"
    if kind == "number" and "exclusiveMinimum" in schema:
        upper = f" and <= {schema['maximum']}" if "maximum" in schema else ""
        return f"number > {schema['exclusiveMinimum']}{upper}"
    if kind == "array":
        return f"list of {_describe(schema.get('items') or {})}"
    if kind == "string" and "pattern" in schema:
        return f"string matching {schema['pattern']}"
    return "null" if kind == "null" else kind
