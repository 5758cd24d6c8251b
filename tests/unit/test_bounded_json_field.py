"""The admin's JSON form field (core.parsers.BoundedJSONField): the API body's bounds, and otherwise Django's own."""

from __future__ import annotations

from typing import Any

import pytest
from django import forms
from django.forms.fields import JSONString

from core.parsers import MAX_JSON_DEPTH, BoundedJSONField

WITHIN = ['{"a": [1, 2.5, null, "x"]}', "[1, 2]", '"text"', "1.5", "17", "null", "true", '{"emoji": "\\ud83d\\ude00"}', "{}"]


@pytest.mark.parametrize("text", WITHIN)
def test_a_value_within_the_bounds_is_what_django_s_own_field_makes_of_it(text: str) -> None:
    ours, django_s = BoundedJSONField(required=False).clean(text), forms.JSONField(required=False).clean(text)
    assert ours == django_s and type(ours) is type(django_s)
    if isinstance(django_s, str):
        assert isinstance(ours, JSONString)  # a JSON text value stays a JSON text, not a value to decode again


@pytest.mark.parametrize("text, says", [
    ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "nested deeper than"),
    ('["\\ud800"]', "lone UTF-16 surrogate"),
    ('{"a": "\\u0000"}', "NUL"),
    ("[1e400]", "beyond the largest a double holds"),
])
def test_a_value_past_the_bounds_is_a_form_error_saying_which(text: str, says: str) -> None:
    with pytest.raises(forms.ValidationError) as caught:
        BoundedJSONField().clean(text)
    assert "Must be JSON within bounds" in str(caught.value) and says in str(caught.value)


@pytest.mark.parametrize("text", ["{", "nope", " "])
def test_malformed_json_keeps_django_s_own_message(text: str) -> None:
    def message(field: Any) -> str:
        with pytest.raises(forms.ValidationError) as caught:
            field.clean(text)
        return str(caught.value)

    assert message(BoundedJSONField()) == message(forms.JSONField())
