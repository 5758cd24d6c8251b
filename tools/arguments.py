"""Parse, repair, map and validate the arguments a model sent for a tool call.

The model's arguments arrive as text that may be broken JSON, with field names that drift from
the schema (``start_time`` for ``startDate``), and with values of the wrong type (``"42"``).
:func:`parse_arguments` repairs what it safely can, records what it did, validates against the
tool's JSON Schema (Draft 2020-12, with strict format checks) and, on failure, produces one
message the model can act on.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import json_repair
from jsonschema import FormatChecker
from jsonschema.exceptions import ValidationError

from audit.masking import normalize_key
from runtime import schemas
from runtime.serde import NUL, without_nul

__all__ = [
    "ArgumentProblem",
    "ParsedArguments",
    "arguments_hash",
    "canonical_json",
    "format_checker",
    "normalize_name",
    "parse_arguments",
]

ARGUMENTS_FIELD = "(arguments)"
NUL_REPAIR = "replaced NUL characters with U+FFFD"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArgumentProblem:
    """One thing wrong with the arguments. ``received`` is a short JSON rendering of the value."""

    field: str
    expected: str
    received: str
    message: str


@dataclass
class ParsedArguments:
    ok: bool
    arguments: dict[str, Any]
    #: True when anything was repaired or coerced; ``repairs`` says what.
    repaired: bool = False
    repairs: list[str] = field(default_factory=list)
    #: Field renames applied, as (name the model used, schema name).
    mapped: list[tuple[str, str]] = field(default_factory=list)
    errors: list[ArgumentProblem] = field(default_factory=list)
    model_message: str = ""


# --------------------------------------------------------------------------- canonical form


def canonical_json(args: Any) -> str:
    """Stable JSON: sorted keys, no whitespace, UTF-8 kept; non-JSON values via ``str``."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def arguments_hash(args: Any) -> str:
    """sha256 hex of :func:`canonical_json` (duplicate guard, approvals)."""
    return hashlib.sha256(canonical_json(args).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- formats

_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DATETIME_RE = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})$",
)
_TIME_RE = re.compile(r"^\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})?$")
_EMAIL_RE = re.compile(
    r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)+$"
)
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")


def _is_date(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _DATE_RE.match(value):
        return False
    try:
        _dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def _is_datetime(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _DATETIME_RE.match(value):
        return False
    try:
        _dt.datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return False
    return True


def _is_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _TIME_RE.match(value):
        return False
    try:
        _dt.time.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        return False
    return True


def _is_email(value: object) -> bool:
    return not isinstance(value, str) or (len(value) <= 254 and bool(_EMAIL_RE.match(value)))


def _is_uri(value: object) -> bool:
    if not isinstance(value, str) or not value:
        return not isinstance(value, str)
    if any(ch.isspace() for ch in value):
        return False
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    if not parts.scheme or not _SCHEME_RE.match(parts.scheme):
        return False
    return bool(parts.netloc or parts.path)


def format_checker() -> FormatChecker:
    """jsonschema's checker with strict date/date-time/time/email/uri checks that need no extras."""
    checker = FormatChecker()
    checker.checks("date")(_is_date)
    checker.checks("date-time")(_is_datetime)
    checker.checks("time")(_is_time)
    checker.checks("email")(_is_email)
    checker.checks("uri")(_is_uri)
    checker.checks("uri-reference")(lambda v: not isinstance(v, str) or not any(c.isspace() for c in v))
    return checker


_FORMAT_CHECKER = format_checker()

_FORMAT_WORDS = {
    "date": "a date as YYYY-MM-DD",
    "date-time": "a date-time as YYYY-MM-DDTHH:MM:SS with a timezone (e.g. 2024-11-28T14:30:00+08:00)",
    "time": "a time as HH:MM:SS",
    "email": "an email address (e.g. name@example.com)",
    "uri": "an absolute URI (e.g. https://example.com/path)",
    "uuid": "a UUID (e.g. 123e4567-e89b-12d3-a456-426614174000)",
    "ipv4": "an IPv4 address",
    "ipv6": "an IPv6 address",
}

_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean (true or false)",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


# --------------------------------------------------------------------------- names

#: Groups of names (normalised: lower case, no separators) that usually mean the same thing.
SYNONYM_GROUPS: list[frozenset[str]] = [
    frozenset(
        {
            "startdate",
            "starttime",
            "startdatetime",
            "start",
            "startat",
            "startson",
            "startday",
            "fromdate",
            "fromtime",
            "datefrom",
            "begindate",
            "begin",
            "beginat",
            "since",
        }
    ),
    frozenset(
        {"enddate", "endtime", "enddatetime", "end", "endat", "todate", "totime", "dateto", "until", "finishdate"}
    ),
    frozenset({"orderid", "orderno", "ordernumber", "ordernum", "orderref", "orderreference", "order"}),
    frozenset({"userid", "uid", "userno", "usernumber"}),
    frozenset({"customerid", "custid", "customerno", "customernumber", "clientid"}),
    frozenset({"flightno", "flightnumber", "flightid", "flightcode", "flight"}),
    frozenset({"query", "q", "keyword", "keywords", "searchterm", "searchquery", "search", "querytext"}),
    frozenset({"limit", "maxresults", "pagesize", "perpage", "numresults", "topk", "top"}),
    frozenset({"email", "emailaddress", "mail", "emailaddr"}),
    frozenset({"phone", "phonenumber", "phoneno", "mobile", "mobilenumber", "tel", "telephone", "cellphone"}),
    frozenset({"origin", "fromcity", "departurecity", "departure", "source", "src", "departureairport"}),
    frozenset({"destination", "tocity", "arrivalcity", "arrival", "dest", "arrivalairport"}),
    frozenset({"amount", "amt", "totalamount"}),
    frozenset({"reason", "cause", "note", "remark", "remarks"}),
]
_SYNONYMS: dict[str, set[str]] = {}
for _group in SYNONYM_GROUPS:
    for _name in _group:
        _SYNONYMS.setdefault(_name, set()).update(_group)


def normalize_name(name: str) -> str:
    """``startDate``, ``start_date``, ``start-date``, ``Start Date`` -> ``startdate`` (masking's key normalisation,
    remembered per name)."""
    return normalize_key(name)


# --------------------------------------------------------------------------- helpers


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def _types(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    return []


def _first_example(schema: dict[str, Any]) -> Any:
    examples = schema.get("examples")
    if isinstance(examples, list) and examples:
        return examples[0]
    if "example" in schema:
        return schema["example"]
    return None


def describe_schema(schema: dict[str, Any]) -> str:
    """A short English description of what a (sub)schema expects."""
    if not isinstance(schema, dict):
        return "a value"
    if "const" in schema:
        return f"exactly {_short(schema['const'])}"
    if "enum" in schema:
        return "one of " + ", ".join(_short(v) for v in schema["enum"])
    fmt = schema.get("format")
    example = _first_example(schema)
    if fmt in _FORMAT_WORDS:
        text = _FORMAT_WORDS[fmt]
    elif "pattern" in schema:
        text = f"a string matching {schema['pattern']}"
    else:
        types = [t for t in _types(schema) if t != "null"]
        if not types:
            for key in ("anyOf", "oneOf"):
                if isinstance(schema.get(key), list):
                    parts = [describe_schema(s) for s in schema[key] if _types(s) != ["null"]]
                    if parts:
                        text = " or ".join(dict.fromkeys(parts))
                        break
            else:
                text = "a value"
        else:
            text = " or ".join(_TYPE_WORDS.get(t, t) for t in types)
            if types == ["array"] and isinstance(schema.get("items"), dict):
                inner = describe_schema(schema["items"])
                if inner != "a value":
                    text = f"a list of {inner.removeprefix('a ').removeprefix('an ')}s"
        bounds = []
        if "minimum" in schema:
            bounds.append(f">= {schema['minimum']}")
        if "exclusiveMinimum" in schema:
            bounds.append(f"> {schema['exclusiveMinimum']}")
        if "maximum" in schema:
            bounds.append(f"<= {schema['maximum']}")
        if "exclusiveMaximum" in schema:
            bounds.append(f"< {schema['exclusiveMaximum']}")
        if bounds:
            text += " " + " and ".join(bounds)
    if "null" in _types(schema):
        text += " (or null)"
    if example is not None:
        text += f" (e.g. {example if isinstance(example, str) else _short(example)})"
    return text


def _subschema(schema: dict[str, Any], path: list[str | int]) -> dict[str, Any]:
    current: Any = schema
    for part in path:
        if not isinstance(current, dict):
            return {}
        if isinstance(part, int):
            current = current.get("items", {})
        else:
            props = current.get("properties", {})
            current = props.get(part) if isinstance(props, dict) and part in props else {}
    return current if isinstance(current, dict) else {}


def _path_text(path: list[str | int] | Any) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or ARGUMENTS_FIELD


# --------------------------------------------------------------------------- the steps


def _decode(raw: str | dict[str, Any] | Any, result: ParsedArguments) -> Any:
    if isinstance(raw, dict):
        return dict(raw)
    if raw is None:
        return {}
    if not isinstance(raw, str | bytes):
        return raw
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.strip().lstrip("\ufeff")
    if NUL in text:
        text = without_nul(text)
        result.repairs.append(NUL_REPAIR)
    if not text:
        return {}
    fence = re.match(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```\s*$", text, re.S)
    if fence:
        text = fence.group(1).strip()
        result.repairs.append("removed a markdown code fence")
    try:
        value = json.loads(text)
    except ValueError:
        value = json_repair.loads(text)
        if isinstance(value, dict | list) and (value or text in ("{}", "[]")):
            result.repairs.append("repaired malformed JSON")
        else:
            return _Undecodable(text)
    if isinstance(value, str):  # double-encoded JSON: "{\"a\": 1}"
        inner = value.strip()
        if inner.startswith("{"):
            try:
                decoded = json.loads(inner)
            except ValueError:
                decoded = json_repair.loads(inner)
            if isinstance(decoded, dict):
                result.repairs.append("decoded JSON that was encoded twice")
                return decoded
    return value


@dataclass(frozen=True)
class _Undecodable:
    text: str


def _alias_table(schema: dict[str, Any], aliases: dict[str, str] | None) -> dict[str, str]:
    table: dict[str, str] = {}
    props = schema.get("properties") or {}
    for prop, sub in props.items():
        if isinstance(sub, dict):
            for alias in sub.get("x-aliases") or ():
                table[normalize_name(str(alias))] = prop
    for alias, target in (aliases or {}).items():
        if target in props:
            table[normalize_name(alias)] = target
    return table


def _map_fields(
    value: dict[str, Any],
    schema: dict[str, Any],
    aliases: dict[str, str] | None,
    result: ParsedArguments,
    prefix: str,
) -> dict[str, Any]:
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return value
    alias_table = _alias_table(schema, aliases if not prefix else None)
    by_norm: dict[str, list[str]] = {}
    for prop in props:
        by_norm.setdefault(normalize_name(prop), []).append(prop)
    out: dict[str, Any] = {k: v for k, v in value.items() if k in props}
    for key, item in value.items():
        if key in props:
            continue
        norm = normalize_name(str(key))
        target: str | None = None
        if norm in alias_table:
            target = alias_table[norm]
        elif len(by_norm.get(norm, [])) == 1:
            target = by_norm[norm][0]
        else:
            group = _SYNONYMS.get(norm, set())
            candidates = [p for p in props if normalize_name(p) in group]
            if len(candidates) == 1:
                target = candidates[0]
        if target is not None and target not in out and target not in value:
            out[target] = item
            result.mapped.append((prefix + str(key), prefix + target))
        else:
            out[key] = item
    # recurse into nested objects / lists of objects
    for prop, sub in props.items():
        if prop not in out or not isinstance(sub, dict):
            continue
        child = out[prop]
        if isinstance(child, dict) and "properties" in sub:
            out[prop] = _map_fields(child, sub, None, result, f"{prefix}{prop}.")
        elif isinstance(child, list) and isinstance(sub.get("items"), dict) and "properties" in sub["items"]:
            out[prop] = [
                _map_fields(x, sub["items"], None, result, f"{prefix}{prop}[{i}].") if isinstance(x, dict) else x
                for i, x in enumerate(child)
            ]
    return out


_INT_RE = re.compile(r"^[+-]?\d+$")
_NUM_RE = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")


def _coerce_scalar(value: Any, types: list[str]) -> tuple[bool, Any]:
    """Return (changed, new value) for an unambiguous conversion to one of ``types``."""
    if not types:
        return False, value
    if isinstance(value, bool):
        ok = "boolean" in types
    elif isinstance(value, int):
        ok = "integer" in types or "number" in types
    elif isinstance(value, float):
        ok = "number" in types
    elif isinstance(value, str):
        ok = "string" in types
    elif value is None:
        ok = "null" in types
    elif isinstance(value, list):
        ok = "array" in types
    elif isinstance(value, dict):
        ok = "object" in types
    else:
        ok = False
    if ok:
        return False, value
    if isinstance(value, str):
        text = value.strip()
        if "integer" in types and _INT_RE.match(text):
            return True, int(text)
        if "number" in types and _NUM_RE.match(text):
            number = float(text)
            return True, int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
        if "boolean" in types and text.lower() in ("true", "false"):
            return True, text.lower() == "true"
        if "null" in types and text.lower() in ("null", "none"):
            return True, None
        if ("array" in types and text.startswith("[")) or ("object" in types and text.startswith("{")):
            try:
                parsed = json.loads(text)
            except ValueError:
                return False, value
            if (isinstance(parsed, list) and "array" in types) or (isinstance(parsed, dict) and "object" in types):
                return True, parsed
        return False, value
    if isinstance(value, float) and "integer" in types and value.is_integer():
        return True, int(value)
    if isinstance(value, int) and not isinstance(value, bool) and "string" in types:
        return True, str(value)
    return False, value


def _coerce(value: Any, schema: dict[str, Any], result: ParsedArguments, path: str) -> Any:
    if not isinstance(schema, dict):
        return value
    types = _types(schema)
    changed, new = _coerce_scalar(value, types)
    if changed:
        result.repairs.append(f"{path or ARGUMENTS_FIELD}: converted {_short(value)} to {_short(new)}")
        value = new
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        props = schema["properties"]
        value = {
            k: _coerce(v, props[k], result, f"{path}.{k}" if path else k) if k in props else v for k, v in value.items()
        }
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [_coerce(v, schema["items"], result, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def _problem_for(error: ValidationError, schema: dict[str, Any]) -> list[ArgumentProblem]:
    path = list(error.absolute_path)
    keyword = error.validator
    sub = error.schema if isinstance(error.schema, dict) else {}
    if keyword == "required":
        instance = error.instance if isinstance(error.instance, dict) else {}
        problems = []
        for name in error.validator_value:
            if name in instance:
                continue
            field_path = [*path, name]
            expected = describe_schema(_subschema(schema, field_path))
            fname = _path_text(field_path)
            problems.append(
                ArgumentProblem(
                    fname, expected, "nothing", f"{fname}: required, expected {expected}, but it is missing"
                )
            )
        return problems
    fname = _path_text(path)
    received = _short(error.instance)
    if keyword == "additionalProperties":
        instance = error.instance if isinstance(error.instance, dict) else {}
        allowed = list((sub.get("properties") or {}).keys())
        extra = [k for k in instance if k not in allowed]
        return [_unknown_problem(fname if path else "", k, allowed) for k in extra]
    if keyword in ("type", "format", "pattern", "enum", "const", "anyOf", "oneOf"):
        expected = describe_schema(sub)
    elif keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        expected = describe_schema({"type": _types(sub) or ["number"], keyword: error.validator_value})
    elif keyword in ("minLength", "maxLength"):
        word = "at least" if keyword == "minLength" else "at most"
        expected = f"a string of {word} {error.validator_value} characters"
    elif keyword in ("minItems", "maxItems"):
        word = "at least" if keyword == "minItems" else "at most"
        expected = f"a list of {word} {error.validator_value} items"
    elif keyword == "uniqueItems":
        expected = "a list without duplicates"
    else:
        expected = error.message
    return [ArgumentProblem(fname, expected, received, f"{fname}: expected {expected}, got {received}")]


def _unknown_problem(prefix: str, key: str, allowed: list[str]) -> ArgumentProblem:
    fname = f"{prefix}.{key}" if prefix else key
    names = ", ".join(allowed) if allowed else "(none)"
    return ArgumentProblem(
        fname,
        f"one of the known fields: {names}",
        _short(key),
        f"{fname}: unknown field; allowed fields are: {names}",
    )


def _unknown_fields(value: dict[str, Any], schema: dict[str, Any], policy: str) -> list[ArgumentProblem]:
    """Unknown top-level fields (unless the schema explicitly allows extra properties)."""
    props = schema.get("properties")
    if not isinstance(props, dict) or policy != "error":
        return []
    if "additionalProperties" in schema or schema.get("patternProperties"):
        return []  # False: reported by validation; anything else: extra fields are allowed
    return [_unknown_problem("", k, list(props)) for k in value if k not in props]


def parse_arguments(
    raw: str | dict[str, Any],
    schema: dict[str, Any],
    *,
    aliases: dict[str, str] | None = None,
    tool_name: str | None = None,
    unknown_fields: str = "error",
    coerce: bool = True,
) -> ParsedArguments:
    """Repair, map, coerce and validate ``raw`` against ``schema``.

    ``aliases`` maps names the model may use to schema property names (``{"from": "startDate"}``);
    properties may also list ``"x-aliases"``. ``unknown_fields``: ``"error"`` (default; fields not
    in ``properties`` are reported with the allowed names unless the schema allows extra
    properties), ``"drop"`` (silently removed, recorded in ``repairs``) or ``"keep"``.
    Never raises for bad input; look at ``.ok``, ``.errors`` and ``.model_message``.
    """
    schema = schema or {}
    result = ParsedArguments(ok=False, arguments={})
    value = _decode(raw, result)
    clean = without_nul(value)
    if clean != value and NUL_REPAIR not in result.repairs:  # PostgreSQL cannot store NUL; U+FFFD takes its place
        result.repairs.append(NUL_REPAIR)
    value = clean
    if isinstance(value, _Undecodable) or not isinstance(value, dict):
        received = _short(value.text if isinstance(value, _Undecodable) else value)
        kind = "text that is not JSON" if isinstance(value, _Undecodable) else f"JSON {_json_kind(value)}"
        problem = ArgumentProblem(
            ARGUMENTS_FIELD,
            "a JSON object with named fields",
            received,
            f"the arguments must be a JSON object with named fields, got {kind}: {received}",
        )
        result.errors.append(problem)
        result.repaired = bool(result.repairs)
        result.model_message = _model_message(result, schema, tool_name)
        return result

    value = _map_fields(value, schema, aliases, result, "")
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    if props and unknown_fields == "drop" and schema.get("additionalProperties") in (None, False):
        for key in [k for k in value if k not in props]:
            value.pop(key)
            result.repairs.append(f"dropped unknown field {key!r}")
    if coerce:
        value = _coerce(value, schema, result, "")
    result.arguments = value

    problems: list[ArgumentProblem] = []
    if unknown_fields == "error":
        problems.extend(_unknown_fields(value, schema, unknown_fields))
    try:
        errors = sorted(schemas.problems_of(schema, value, _FORMAT_CHECKER),
                        key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    except schemas.CheckError as exc:  # the tool's schema (tenant input) cannot check them: too slow, a bad $ref
        log.warning("tool %s: its argument schema cannot be checked: %s", tool_name, exc)
        errors = []
        problems.append(ArgumentProblem(
            ARGUMENTS_FIELD, "arguments the tool's schema can check", _short(value),
            f"these arguments could not be checked: {exc}. This is a fault in the tool's schema, not in your "
            "arguments; calling it again will fail the same way, so go on without this tool or tell the user"))
    for error in errors:
        problems.extend(_problem_for(error, schema))
    seen: set[str] = set()
    for problem in problems:
        if problem.message not in seen:
            seen.add(problem.message)
            result.errors.append(problem)
    result.ok = not result.errors
    result.repaired = bool(result.repairs)
    if not result.ok:
        result.model_message = _model_message(result, schema, tool_name)
    return result


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "null" if value is None else type(value).__name__


def _model_message(result: ParsedArguments, schema: dict[str, Any], tool_name: str | None) -> str:
    target = tool_name or "the tool"
    lines = [f"The arguments for {target} are invalid:"]
    lines.extend(f"- {problem.message}" for problem in result.errors)
    if result.mapped:
        renames = ", ".join(f"{a} as {b}" for a, b in result.mapped)
        lines.append(f"(Read {renames}.)")
    lines.append(f"Fix the arguments and call {target} again.")
    return "\n".join(lines)
