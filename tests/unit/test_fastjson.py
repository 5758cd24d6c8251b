"""core/fastjson.py: the same compact text as the standard library for JSON-shaped data, and its fallback."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core import fastjson


def _stdlib(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("value", [
    {"a": 1, "b": [True, False, None], "c": {"d": "é ✓ \u2028 \"quoted\" \\ \n\t"}, "e": 1.5, "f": -0.25},
    [{"id": None, "seq": 12, "payload": {"stage": "validate", "mapped": []}, "at": "2026-12-06T16:00:00+00:00"}] * 3,
    {"nested": [[[[1, 2, {"x": "y"}]]]], "empty": {}, "list": []},
    "plain text", 0, 2**63 - 1, -(2**63),
])
def test_json_shaped_data_is_written_exactly_as_the_standard_library_writes_it(value: Any) -> None:
    assert fastjson.dumps(value) == _stdlib(value)


def test_integer_keys_are_written_as_strings_as_the_standard_library_does() -> None:
    assert fastjson.dumps({1: "a", "b": 2}) == _stdlib({1: "a", "b": 2}) == '{"1":"a","b":2}'


@pytest.mark.parametrize("value", [{"big": 2**64 + 1}, {"lone": "\ud800 surrogate"}, [-(2**70)]],
                         ids=["beyond-64-bits", "lone-surrogate", "negative-beyond-64-bits"])
def test_what_orjson_refuses_goes_through_the_standard_library(value: Any) -> None:
    assert fastjson.dumps(value) == _stdlib(value)
