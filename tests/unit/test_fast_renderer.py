"""Issue #14: the API's responses encoded by orjson are the same bytes DRF's JSONRenderer wrote (core/renderers.py)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections import OrderedDict
from typing import Any

import pytest
from django.utils.translation import gettext_lazy
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.serializer_helpers import ReturnDict, ReturnList

from core.renderers import FastJSONRenderer

UTC = dt.UTC
SAME = [
    {"id": "0b6f2c1e", "status": "running", "step": 3, "usage": {"tokens": 120, "cost": 0.0042}, "links": None},
    [1, 2.5, True, False, None, "", "naïve — 東京 ✓ \"quoted\" \\ back\nline\ttab \x01"],
    {"when": dt.datetime(2026, 12, 7, 7, 0, 0, 123456, tzinfo=UTC), "naive": dt.datetime(2026, 12, 7, 7, 0),
     "whole": dt.datetime(2026, 12, 7, 7, 0, tzinfo=UTC),
     "offset": dt.datetime(2026, 12, 7, 9, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))),
     "day": dt.date(2026, 12, 7), "time": dt.time(7, 30, 1)},
    {"uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"), "decimal": decimal.Decimal("12.50"), "lazy": gettext_lazy("Not found.")},
    {1: "integer key", "nested": {"deep": [{"a": [[], {}]}]}},
    ReturnDict(OrderedDict([("b", 1), ("a", 2)]), serializer=None),
    ReturnList([{"x": 1}], serializer=None),
    {"separators": "a\u2028b\u2029c"},  # escaped for JavaScript, as DRF does
    {"big": 2**63 - 1, "negative": -(2**63)},
    {"big": 2**70},  # beyond orjson: through DRF's renderer
    {"a set": {"only"}, "a tuple": (1, 2)},
]


@pytest.mark.parametrize("data", SAME, ids=range(len(SAME)))
def test_the_same_bytes_as_drf(data: Any) -> None:
    assert FastJSONRenderer().render(data, "application/json") == JSONRenderer().render(data, "application/json")


def test_line_separators_stay_escaped_and_utc_ends_in_z() -> None:
    text = FastJSONRenderer().render({"s": "\u2028\u2029", "t": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)})
    assert text == b'{"s":"\\u2028\\u2029","t":"2026-01-02T03:04:05Z"}'


def test_indented_rendering_and_nothing_are_drf_s() -> None:
    data = {"a": [1, {"b": 2}]}
    for media in ("application/json; indent=4", "application/json; indent=2"):
        assert FastJSONRenderer().render(data, media) == JSONRenderer().render(data, media)
        assert b"\n" in FastJSONRenderer().render(data, media)
    assert FastJSONRenderer().render(data, None, {"indent": 4}) == JSONRenderer().render(data, None, {"indent": 4})
    assert FastJSONRenderer().render(None) == b""


def test_what_neither_can_encode_still_fails_as_it_did() -> None:
    with pytest.raises(TypeError):
        FastJSONRenderer().render({"x": object()})
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate: orjson refuses it, DRF's renderer fails on it as before
        FastJSONRenderer().render({"surrogate": "\ud800"})


def test_a_float_that_is_not_a_number_is_null_not_a_failed_response() -> None:
    assert json.loads(FastJSONRenderer().render({"x": float("nan"), "y": float("inf")})) == {"x": None, "y": None}


def test_the_api_renders_with_it() -> None:
    from rest_framework.settings import api_settings

    assert api_settings.DEFAULT_RENDERER_CLASSES[0] is FastJSONRenderer
