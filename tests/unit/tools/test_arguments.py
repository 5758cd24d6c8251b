from __future__ import annotations

import pytest

from tools.arguments import arguments_hash, canonical_json, parse_arguments

FLIGHTS = {
    "type": "object",
    "properties": {
        "origin": {"type": "string"},
        "destination": {"type": "string"},
        "startDate": {"type": "string", "format": "date"},
        "endDate": {"type": "string", "format": "date"},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "direct_only": {"type": "boolean"},
        "cabin": {"type": "string", "enum": ["economy", "business"]},
    },
    "required": ["origin", "destination", "startDate"],
    "additionalProperties": False,
}

ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": r"^O\d{12}$", "examples": ["O202411280001"]},
        "contact_email": {"type": "string", "format": "email"},
        "callback": {"type": "string", "format": "uri"},
        "when": {"type": "string", "format": "date-time"},
        "reason": {"type": "string", "x-aliases": ["why"]},
        "amount": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["order_id"],
}


@pytest.mark.parametrize(
    ("raw", "repair"),
    [
        ("{origin: 'PEK', destination: 'SHA', startDate: '2024-11-28',}", "repaired malformed JSON"),
        ('{"origin": "PEK", "destination": "SHA", "startDate": "2024-11-28"', "repaired malformed JSON"),
        ('```json\n{"origin": "PEK", "destination": "SHA", "startDate": "2024-11-28"}\n```', "markdown code fence"),
        ("{'origin': 'PEK', 'destination': 'SHA', 'startDate': '2024-11-28', }", "repaired malformed JSON"),
        (
            '"{\\"origin\\": \\"PEK\\", \\"destination\\": \\"SHA\\", \\"startDate\\": \\"2024-11-28\\"}"',
            "encoded twice",
        ),
    ],
)
def test_broken_json_is_repaired(raw: str, repair: str) -> None:
    result = parse_arguments(raw, FLIGHTS)
    assert result.ok, result.model_message
    assert result.arguments == {"origin": "PEK", "destination": "SHA", "startDate": "2024-11-28"}
    assert result.repaired
    assert any(repair in r for r in result.repairs)


def test_valid_json_is_not_marked_repaired() -> None:
    result = parse_arguments('{"origin": "PEK", "destination": "SHA", "startDate": "2024-11-28"}', FLIGHTS)
    assert result.ok and not result.repaired and result.mapped == [] and result.model_message == ""


def test_dict_input_and_empty_string() -> None:
    assert parse_arguments({"origin": "A", "destination": "B", "startDate": "2024-01-01"}, FLIGHTS).ok
    empty = parse_arguments("", {"type": "object", "properties": {}})
    assert empty.ok and empty.arguments == {}


@pytest.mark.parametrize("raw", ["[1, 2, 3]", "42", "just some words", '"a string"'])
def test_non_object_is_an_error(raw: str) -> None:
    result = parse_arguments(raw, FLIGHTS, tool_name="search_flights")
    assert not result.ok
    assert result.errors[0].field == "(arguments)"
    assert "must be a JSON object" in result.model_message
    assert result.model_message.endswith("Fix the arguments and call search_flights again.")


def test_field_mapping_synonyms_and_case() -> None:
    raw = (
        '{"Origin": "PEK", "destination": "SHA", "start_time": "2024-11-28", "to_date": "2024-12-01", '
        '"DirectOnly": true}'
    )
    result = parse_arguments(raw, FLIGHTS)
    assert result.ok, result.model_message
    assert result.arguments == {
        "origin": "PEK",
        "destination": "SHA",
        "startDate": "2024-11-28",
        "endDate": "2024-12-01",
        "direct_only": True,
    }
    assert ("start_time", "startDate") in result.mapped
    assert ("to_date", "endDate") in result.mapped
    assert ("Origin", "origin") in result.mapped
    assert ("DirectOnly", "direct_only") in result.mapped


@pytest.mark.parametrize("name", ["start_date", "startTime", "from_date", "start-date", "START_DATE"])
def test_start_synonyms(name: str) -> None:
    result = parse_arguments({"origin": "A", "destination": "B", name: "2024-11-28"}, FLIGHTS)
    assert result.ok and result.arguments["startDate"] == "2024-11-28"
    assert result.mapped == [(name, "startDate")]


def test_mapping_never_overwrites_a_given_field() -> None:
    result = parse_arguments(
        {"origin": "A", "destination": "B", "startDate": "2024-11-28", "start_time": "2024-01-01"}, FLIGHTS
    )
    assert not result.ok
    assert result.arguments["startDate"] == "2024-11-28"
    assert any(e.field == "start_time" and "unknown field" in e.message for e in result.errors)


def test_order_id_synonyms_and_aliases() -> None:
    for name in ("orderId", "order_no", "order_number", "OrderNumber"):
        result = parse_arguments({name: "O202411280001"}, ORDER)
        assert result.ok and result.arguments == {"order_id": "O202411280001"}, name
    explicit = parse_arguments({"ref": "O202411280001", "why": "damaged"}, ORDER, aliases={"ref": "order_id"})
    assert explicit.ok
    assert explicit.arguments == {"order_id": "O202411280001", "reason": "damaged"}
    assert set(explicit.mapped) == {("ref", "order_id"), ("why", "reason")}


def test_camel_and_snake_mapping_in_nested_objects() -> None:
    schema = {
        "type": "object",
        "properties": {
            "passengers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"first_name": {"type": "string"}, "birthDate": {"type": "string", "format": "date"}},
                    "required": ["first_name"],
                },
            }
        },
    }
    result = parse_arguments({"passengers": [{"firstName": "Li", "birth_date": "1990-01-02"}]}, schema)
    assert result.ok, result.model_message
    assert result.arguments == {"passengers": [{"first_name": "Li", "birthDate": "1990-01-02"}]}
    assert ("passengers[0].firstName", "passengers[0].first_name") in result.mapped


def test_readable_errors_name_field_expected_and_received() -> None:
    result = parse_arguments(
        {"origin": "PEK", "destination": "SHA", "startDate": "2024-12-32", "passengers": 0, "cabin": "first"},
        FLIGHTS,
        tool_name="search_flights",
    )
    assert not result.ok
    by_field = {e.field: e for e in result.errors}
    assert by_field["startDate"].message == 'startDate: expected a date as YYYY-MM-DD, got "2024-12-32"'
    assert by_field["startDate"].received == '"2024-12-32"'
    assert by_field["passengers"].expected == "an integer >= 1"
    assert by_field["cabin"].message == 'cabin: expected one of "economy", "business", got "first"'
    msg = result.model_message
    assert msg.startswith("The arguments for search_flights are invalid:")
    assert 'startDate: expected a date as YYYY-MM-DD, got "2024-12-32"' in msg
    assert msg.endswith("Fix the arguments and call search_flights again.")


def test_pattern_error_with_example() -> None:
    result = parse_arguments('{"order_id": "12345"}', ORDER, tool_name="query_order")
    assert not result.ok
    assert 'order_id: expected a string matching ^O\\d{12}$ (e.g. O202411280001), got "12345"' in result.model_message


def test_missing_required_and_unknown_fields() -> None:
    result = parse_arguments({"origin": "PEK", "colour": "red"}, FLIGHTS, tool_name="search_flights")
    assert not result.ok
    fields = {e.field for e in result.errors}
    assert {"destination", "startDate", "colour"} <= fields
    msg = result.model_message
    assert "startDate: required, expected a date as YYYY-MM-DD, but it is missing" in msg
    assert "colour: unknown field; allowed fields are: origin, destination, startDate, endDate" in msg
    # unknown fields are reported even when the schema does not say additionalProperties: false
    loose = parse_arguments({"order_id": "O202411280001", "colour": "red"}, ORDER)
    assert not loose.ok and loose.errors[0].field == "colour"
    dropped = parse_arguments({"order_id": "O202411280001", "colour": "red"}, ORDER, unknown_fields="drop")
    assert dropped.ok and dropped.arguments == {"order_id": "O202411280001"} and dropped.repaired


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("contact_email", "a@example.com", True),
        ("contact_email", "not-an-email", False),
        ("callback", "https://example.com/cb?x=1", True),
        ("callback", "not a uri", False),
        ("when", "2024-11-28T14:30:00+08:00", True),
        ("when", "2024-11-28T14:30:00Z", True),
        ("when", "2024-11-28 14:30", False),
        ("when", "2024-02-30T10:00:00Z", False),
    ],
)
def test_formats(field: str, value: str, ok: bool) -> None:
    assert parse_arguments({"order_id": "O202411280001", field: value}, ORDER).ok is ok


def test_strict_dates() -> None:
    for bad in ("2024-12-32", "2023-02-29", "2024-13-01", "24-12-01", "2024/12/01", "20241201"):
        assert not parse_arguments({"origin": "A", "destination": "B", "startDate": bad}, FLIGHTS).ok, bad
    assert parse_arguments({"origin": "A", "destination": "B", "startDate": "2024-02-29"}, FLIGHTS).ok


def test_light_coercion_is_recorded() -> None:
    result = parse_arguments(
        '{"origin": "A", "destination": "B", "startDate": "2024-11-28", "passengers": "2", "direct_only": "TRUE"}',
        FLIGHTS,
    )
    assert result.ok
    assert result.arguments["passengers"] == 2 and result.arguments["direct_only"] is True
    assert result.repaired
    assert any("passengers" in r and '"2"' in r for r in result.repairs)
    order = parse_arguments({"order_id": "O202411280001", "amount": "12.5", "tags": '["a", "b"]'}, ORDER)
    assert order.ok and order.arguments["amount"] == 12.5 and order.arguments["tags"] == ["a", "b"]
    numeric_id = parse_arguments({"order_id": 12345}, ORDER)
    assert numeric_id.arguments["order_id"] == "12345"  # int -> string, then the pattern still fails
    assert not numeric_id.ok


def test_ambiguous_values_are_not_coerced() -> None:
    result = parse_arguments(
        {"origin": "A", "destination": "B", "startDate": "2024-11-28", "passengers": "two", "direct_only": "yes"},
        FLIGHTS,
    )
    assert not result.ok
    assert {e.field for e in result.errors} == {"passengers", "direct_only"}
    assert 'passengers: expected an integer >= 1 and <= 9, got "two"' in result.model_message


def test_canonical_json_and_hash() -> None:
    a = {"b": 1, "a": [1, {"y": "é", "x": None}]}
    b = {"a": [1, {"x": None, "y": "é"}], "b": 1}
    assert canonical_json(a) == '{"a":[1,{"x":null,"y":"é"}],"b":1}'
    assert arguments_hash(a) == arguments_hash(b)
    assert len(arguments_hash(a)) == 64
    assert arguments_hash(a) != arguments_hash({"b": 2, "a": [1, {"y": "é", "x": None}]})


def test_nul_characters_in_arguments_become_the_replacement_character_and_the_repair_is_noted() -> None:
    schema = {"type": "object", "properties": {"note": {"type": "string"}}}
    for raw in ('{"note": "a\\u0000b"}', '{"note": "a\x00b"}'):
        result = parse_arguments(raw, schema)
        assert result.ok, result.errors
        assert result.arguments == {"note": "a\ufffdb"}
        assert "replaced NUL characters with U+FFFD" in result.repairs
    clean = parse_arguments('{"note": "ab"}', schema)
    assert clean.arguments == {"note": "ab"} and not clean.repairs


def test_without_nul_reaches_keys_and_nested_values_and_leaves_other_values_alone() -> None:
    from runtime.serde import without_nul

    value = {"k\x00": ["x\x00y", ("\x00",), 3, None, 1.5, True], "plain": {"n": "ok"}}
    assert without_nul(value) == {"k\ufffd": ["x\ufffdy", ("\ufffd",), 3, None, 1.5, True], "plain": {"n": "ok"}}
    text = "no nul here"
    assert without_nul(text) is text
