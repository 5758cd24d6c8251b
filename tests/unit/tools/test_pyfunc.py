from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass
from typing import Annotated, Literal, Optional, TypedDict

import pytest

from tools import pyfunc
from tools.arguments import parse_arguments
from tools.pyfunc import Param, PythonToolRegistry, RegistryFrozenError, ToolArgumentError, parse_docstring, tool


class Cabin(enum.Enum):
    ECONOMY = "economy"
    BUSINESS = "business"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass
class Passenger:
    name: str
    age: int | None = None


@pytest.fixture
def reg() -> PythonToolRegistry:
    return PythonToolRegistry()


def test_schema_from_hints_and_docstring(reg: PythonToolRegistry) -> None:
    @tool("travel.search_flights", registry=reg)
    def search_flights(
        origin: str,
        destination: Annotated[str, Param(description="IATA code", pattern=r"^[A-Z]{3}$", examples=["SHA"])],
        startDate: dt.date,
        passengers: int = 1,
        cabin: Cabin = Cabin.ECONOMY,
        max_price: float | None = None,
        sort: Literal["price", "duration"] = "price",
        tags: list[str] | None = None,
        depart_after: Optional[dt.datetime] = None,  # noqa: UP045 - the old spelling must work too
    ) -> list[dict]:
        """Search flights between two airports on one day.

        Use it when the user asks for flight options. Do not use it to book.

        Args:
            origin: IATA code of the departure airport,
                e.g. PEK.
            destination: overridden by Param.
            startDate (date): Day of departure.
            passengers: Number of travellers.

        Returns:
            Matching flights.
        """
        return []

    t = reg.get("travel.search_flights")
    assert t.key == "travel.search_flights" and t.name == "search_flights"
    assert t.category == "read" and t.idempotent is True
    assert t.description == (
        "Search flights between two airports on one day.\n\nUse it when the user asks for flight options. "
        "Do not use it to book."
    )
    assert t.summary == "Search flights between two airports on one day."
    props = t.schema["properties"]
    assert t.schema["required"] == ["origin", "destination", "startDate"]
    assert t.schema["additionalProperties"] is False
    assert props["origin"] == {"description": "IATA code of the departure airport, e.g. PEK.", "type": "string"}
    assert props["destination"] == {
        "type": "string",
        "description": "IATA code",
        "pattern": "^[A-Z]{3}$",
        "examples": ["SHA"],
    }
    assert props["startDate"] == {"description": "Day of departure.", "type": "string", "format": "date"}
    assert props["passengers"] == {"description": "Number of travellers.", "type": "integer", "default": 1}
    assert props["cabin"] == {"type": "string", "enum": ["economy", "business"], "default": "economy"}
    assert props["max_price"] == {"type": ["number", "null"], "default": None}
    assert props["sort"] == {"type": "string", "enum": ["price", "duration"], "default": "price"}
    assert props["tags"] == {"type": ["array", "null"], "items": {"type": "string"}, "default": None}
    assert props["depart_after"] == {"type": ["string", "null"], "format": "date-time", "default": None}
    assert t.to_openai()["function"]["name"] == "search_flights"


def test_more_types(reg: PythonToolRegistry) -> None:
    def f(
        meta: dict[str, int],
        pair: tuple[int, str],
        ids: set[int],
        anything,
        who: Passenger,
        level: Priority = Priority.LOW,
        either: int | str = 0,
        flag: bool = False,
        raw: dict = None,  # type: ignore[assignment]  # noqa: RUF013
    ) -> None:
        """Summary only."""

    t = reg.register(f, key="misc.f", category="write")
    props = t.schema["properties"]
    assert props["meta"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["pair"] == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
        "maxItems": 2,
    }
    assert props["ids"] == {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    assert props["anything"] == {}
    # a nested dataclass's field says its default too (pydantic's schema; the hand-written one left it out)
    assert props["who"]["properties"] == {"name": {"type": "string"}, "age": {"type": ["integer", "null"], "default": None}}
    assert props["who"]["additionalProperties"] is False
    assert props["who"]["required"] == ["name"]
    assert props["level"] == {"type": "integer", "enum": [1, 2], "default": 1}
    assert props["either"] == {"anyOf": [{"type": "integer"}, {"type": "string"}], "default": 0}
    assert props["flag"] == {"type": "boolean", "default": False}
    assert t.category == "write" and t.idempotent is False
    assert t.description == "Summary only."


def test_varargs_rejected(reg: PythonToolRegistry) -> None:
    def f(*args: int) -> None: ...

    with pytest.raises(TypeError, match="name every parameter"):
        reg.register(f, key="x.f")


def test_call_converts_iso_strings_and_enums(reg: PythonToolRegistry) -> None:
    seen: dict = {}

    @reg.tool("travel.book", category="write", idempotent=True)
    def book(day: dt.date, at: dt.datetime | None, cabin: Cabin, days: list[dt.date], who: Passenger) -> str:
        """Book a flight."""
        seen.update(day=day, at=at, cabin=cabin, days=days, who=who)
        return "ok"

    assert (
        reg.call(
            "travel.book",
            {
                "day": "2024-11-28",
                "at": "2024-11-28T10:30:00Z",
                "cabin": "business",
                "days": ["2024-11-28", "2024-11-29"],
                "who": {"name": "Li", "age": 30},
            },
        )
        == "ok"
    )
    assert seen["day"] == dt.date(2024, 11, 28)
    assert seen["at"] == dt.datetime(2024, 11, 28, 10, 30, tzinfo=dt.UTC)
    assert seen["cabin"] is Cabin.BUSINESS
    assert seen["days"] == [dt.date(2024, 11, 28), dt.date(2024, 11, 29)]
    assert seen["who"] == Passenger("Li", 30)
    reg.call("travel.book", {"day": "2024-11-28", "at": None, "cabin": "economy", "days": [], "who": {"name": "A"}})
    assert seen["at"] is None
    with pytest.raises(ToolArgumentError, match="unknown argument"):
        reg.call("travel.book", {"bogus": 1})
    with pytest.raises(ToolArgumentError, match="missing required"):
        reg.call("travel.book", {"day": "2024-11-28"})
    with pytest.raises(ToolArgumentError, match="day"):
        reg.call(
            "travel.book",
            {"day": "2024-13-40", "at": None, "cabin": "economy", "days": [], "who": {"name": "A"}},
        )


def test_schema_works_with_parse_arguments(reg: PythonToolRegistry) -> None:
    @reg.tool("order_desk.query_order")
    def query_order(
        order_id: Annotated[str, Param(pattern=r"^O\d{12}$", examples=["O202411280001"], aliases=["ref"])],
    ) -> dict:
        """Look up one order by id."""
        return {"order_id": order_id}

    t = reg.get("order_desk.query_order")
    ok = parse_arguments('{"ref": "O202411280001"}', t.schema)
    assert ok.ok and reg.call(t.key, ok.arguments) == {"order_id": "O202411280001"}
    bad = parse_arguments('{"orderId": "12345"}', t.schema, tool_name=t.name)
    assert 'order_id: expected a string matching ^O\\d{12}$ (e.g. O202411280001), got "12345"' in bad.model_message


def test_registry_freeze_duplicates_and_lookup(reg: PythonToolRegistry) -> None:
    def a() -> None:
        """A."""

    def b() -> None:
        """B."""

    reg.register(a, key="k.a")
    reg.register(a, key="k.a")  # re-registering the same function is harmless (module re-import)
    with pytest.raises(ValueError, match="already registered"):
        reg.register(b, key="k.a")
    with pytest.raises(ValueError, match="must match"):
        reg.register(b, key="k.b", name="has space")
    with pytest.raises(ValueError, match="category"):
        reg.register(b, key="k.b", category="delete")  # type: ignore[arg-type]
    reg.freeze()
    assert reg.frozen
    with pytest.raises(RegistryFrozenError):
        reg.register(b, key="k.b")
    assert "k.a" in reg and "k.b" not in reg and len(reg) == 1 and reg.keys() == ["k.a"]
    with pytest.raises(KeyError, match="no Python tool"):
        reg.get("k.b")


def test_module_level_default_registry_exists() -> None:
    assert isinstance(pyfunc.registry, PythonToolRegistry)


def test_parse_docstring_without_sections() -> None:
    description, params = parse_docstring("""One line.

    Second paragraph says when not to use it.
    """)
    assert description == "One line.\n\nSecond paragraph says when not to use it."
    assert params == {}


@dataclass
class Leg:
    origin: str
    day: dt.date


def plan(legs: list[Leg], cabin: Cabin = Cabin.ECONOMY, budget: float = 0.0, window: tuple[int, int] = (0, 24)) -> dict:
    """Plan legs."""
    return {"legs": legs, "cabin": cabin, "budget": budget, "window": window}


def test_arguments_are_converted_and_refused_by_the_parameters_model() -> None:
    reg = PythonToolRegistry()

    t = reg.register(plan, key="travel.plan")
    out = reg.call(t.key, {"legs": [{"origin": "PEK", "day": "2024-11-28"}], "cabin": "business", "budget": 100,
                           "window": [6, 12]})
    assert out["legs"] == [Leg("PEK", dt.date(2024, 11, 28))] and out["cabin"] is Cabin.BUSINESS
    assert out["budget"] == 100.0 and isinstance(out["budget"], float) and out["window"] == (6, 12)
    legs = t.schema["properties"]["legs"]
    assert legs["type"] == "array" and legs["items"]["properties"]["day"] == {"type": "string", "format": "date"}
    assert legs["items"]["required"] == ["origin", "day"] and "$ref" not in str(t.schema)
    with pytest.raises(ToolArgumentError, match=r"argument legs\.0\.day: .*date"):
        reg.call(t.key, {"legs": [{"origin": "PEK", "day": "someday"}]})
    with pytest.raises(ToolArgumentError, match="argument cabin"):
        reg.call(t.key, {"legs": [], "cabin": "first"})


class SeatRow(TypedDict):
    row: int


class Seat(SeatRow, total=False):  # a plain typing.TypedDict: pydantic takes only typing_extensions' before 3.12
    letter: str


def choose(seat: Seat, seats: list[Seat] | None = None) -> dict:
    """Choose a seat."""
    return {"seat": seat, "seats": seats}


def test_a_typeddict_parameter_is_described_and_checked() -> None:
    reg = PythonToolRegistry()
    t = reg.register(choose, key="travel.choose")
    seat = t.schema["properties"]["seat"]
    assert seat["properties"] == {"row": {"type": "integer"}, "letter": {"type": "string"}}
    assert seat["required"] == ["row"] and seat["additionalProperties"] is False
    assert t.schema["properties"]["seats"]["type"] == ["array", "null"]
    assert reg.call(t.key, {"seat": {"row": 3}}) == {"seat": {"row": 3}, "seats": None}
    with pytest.raises(ToolArgumentError, match=r"argument seat\.row"):
        reg.call(t.key, {"seat": {"letter": "A"}})
