"""The one way documents are checked: field paths, wording, every problem at once, defaults, schema."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import Field, ValidationError, field_validator, model_validator

from runtime.documents import (
    Document,
    DocumentError,
    Flag,
    Names,
    choice,
    integer,
    json_object,
    number,
    openapi_schema,
    parse,
    pattern,
    problem,
    problems,
    problems_of,
    text,
)


class Inner(Document):
    limit: Annotated[int | None, integer(nullable=True)] = 8
    mode: Annotated[str, choice("end", "error")] = "end"
    share: Annotated[float, number(nullable=False, maximum=1.0)] = 0.5


class Outer(Document):
    enabled: Flag = True
    inner: Inner = Inner()
    items: list[Annotated[str, pattern(r"^[a-z]+/[a-z]+$", 'must be "provider/model"')]] = []
    names: Names = []
    note: Annotated[str | None, text()] = None
    table: Annotated[dict[str, Any], json_object("must be an object of tier -> limit")] = {}
    low: Annotated[int, integer(0)] = 0
    high: Annotated[int, integer(0)] = 5

    @field_validator("table")
    @classmethod
    def _table(cls, value: dict[str, Any]) -> dict[str, Any]:
        wrong = [f"$.{k}: must be a positive integer, got {v!r}" for k, v in value.items() if not isinstance(v, int)]
        if wrong:
            raise problems_of(wrong)
        return value

    @model_validator(mode="after")
    def _order(self) -> Outer:
        if self.low >= self.high:
            raise problem(f"must be below high ({self.high})", self.low, at=".low")
        return self


def test_defaults_fill_a_partial_document_and_nested_defaults_stay() -> None:
    doc = parse(Outer, {"inner": {"limit": 3}})
    assert doc.inner.limit == 3 and doc.inner.mode == "end" and doc.enabled is True
    assert doc.to_json()["inner"] == {"limit": 3, "mode": "end", "share": 0.5}


def test_every_problem_is_reported_with_its_path_and_what_is_expected() -> None:
    _, found = problems(Outer, {
        "enabled": "yes", "inner": {"limit": 0, "mode": "stop", "share": 2, "extra": 1},
        "items": ["ok/fine", "bad"], "names": [""], "note": "  ", "table": {"free": "x"}, "typo": 1,
    })
    assert found == [
        "enabled: must be true or false, got 'yes'",
        "inner.limit: must be a positive integer or null, got 0",
        "inner.mode: must be one of ['end', 'error'], got 'stop'",
        "inner.share: must be a number above 0 and at most 1.0, got 2",
        "inner.extra: unknown field; expected one of ['limit', 'mode', 'share']",
        'items[1]: must be "provider/model", got \'bad\'',
        "names: must be a list of non-empty strings, got list",
        "note: must be a non-empty string or null, got '  '",
        "table.free: must be a positive integer, got 'x'",
        "typo: unknown field; expected one of ['enabled', 'high', 'inner', 'items', 'low', 'names', 'note', 'table']",
    ]


def test_structural_errors_and_cross_field_checks() -> None:
    assert problems(Outer, {"inner": [1]})[1] == ["inner: must be an object, got list"]
    assert problems(Outer, [])[1] == ["document: must be an object, got list"]
    assert problems(Outer, {"table": 3})[1] == ["table: must be an object of tier -> limit, got 3"]
    assert problems(Outer, {"low": 5, "high": 5})[1] == ["low: must be below high (5), got 5"]
    assert problems(Outer, {"low": 5}, path="policy")[1] == ["policy.low: must be below high (5), got 5"]


def test_parse_raises_with_every_problem_and_documents_are_frozen() -> None:
    with pytest.raises(DocumentError) as caught:
        parse(Outer, {"enabled": 1, "low": -1}, what="policy")
    assert caught.value.errors == ["enabled: must be true or false, got 1", "low: must be an integer >= 0, got -1"]
    assert str(caught.value).startswith("invalid policy:")
    doc = parse(Outer, {})
    with pytest.raises(ValidationError):
        doc.enabled = False


def test_the_json_schema_says_what_the_checks_say() -> None:
    schema = Outer.model_json_schema()
    inner = schema["$defs"]["Inner"]["properties"]
    assert inner["limit"]["anyOf"] == [{"type": "integer", "minimum": 1}, {"type": "null"}]
    assert inner["mode"]["enum"] == ["end", "error"] and inner["mode"]["default"] == "end"
    share = {k: v for k, v in inner["share"].items() if k != "title"}
    assert share == {"type": "number", "exclusiveMinimum": 0, "maximum": 1.0, "default": 0.5}
    assert schema["additionalProperties"] is False
    assert schema["properties"]["items"]["items"]["pattern"] == "^[a-z]+/[a-z]+$"


Price = Annotated[float, number(nullable=False, minimum=0)]


class Keyed(Document):
    table: dict[Annotated[str, pattern(r"^\S+$", "must be a name without spaces")], Price] = {}


def test_a_wrong_dict_key_is_reported_at_the_key_and_minimum_numbers_include_it() -> None:
    assert problems(Keyed, {"table": {"a b": 1, "free": 0, "paid": -1}})[1] == [
        "table.a b: must be a name without spaces, got 'a b'",
        "table.paid: must be a number >= 0, got -1",
    ]
    price = Keyed.model_json_schema()["properties"]["table"]["patternProperties"][r"^\S+$"]
    assert price == {"type": "number", "minimum": 0}


class Required(Document):
    url: Annotated[str, text(nullable=False), Field(description="the endpoint, e.g. https://api.example.com/x")]
    name: str


def test_a_missing_field_says_what_it_is_when_it_has_a_description() -> None:
    assert problems(Required, {})[1] == ["url: is required (the endpoint, e.g. https://api.example.com/x)", "name: is required"]


def test_the_openapi_variant_says_nullable_instead_of_a_null_type() -> None:
    inner = openapi_schema(Outer)["properties"]["inner"]["properties"]
    assert inner["limit"] == {"type": "integer", "minimum": 1, "nullable": True, "default": 8, "title": "Limit"}
    assert inner["share"] == {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1.0, "default": 0.5, "title": "Share"}


class Bounded(Document):
    retries: Annotated[int, integer(0, maximum=5)] = 2


def test_an_integer_with_a_maximum_says_the_range() -> None:
    assert problems(Bounded, {"retries": 6})[1] == ["retries: must be an integer from 0 to 5, got 6"]
    assert problems(Keyed, {"table": {"nan": float("nan"), "inf": float("inf")}})[1] == [
        "table.nan: must be a number >= 0, got nan", "table.inf: must be a number >= 0, got inf"]
    assert Bounded.model_json_schema()["properties"]["retries"]["maximum"] == 5
