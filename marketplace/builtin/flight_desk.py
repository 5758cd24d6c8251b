"""The ``flight-desk`` plugin: a ticketing assistant's tools over a small demo data set.

Flight numbers look like CA1234, booking references like ABC123, dates like 2024-12-20.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Annotated, Any

from marketplace.catalog import AgentPreset, PluginSpec, PluginTool
from tools.pyfunc import Param, tool

AIRPORT = Param(description="IATA airport code, e.g. PEK (Beijing), SHA (Shanghai Hongqiao), CAN (Guangzhou).",
                pattern=r"^[A-Z]{3}$", examples=["PEK"])
FLIGHT_NO = Param(description="Flight number: airline code and digits, e.g. CA1234.", pattern=r"^[A-Z0-9]{2}\d{3,4}$",
                  examples=["CA1234"])
BOOKING_REF = Param(description="The six-character booking reference, e.g. ABC123.", pattern=r"^[A-Z0-9]{6}$",
                    examples=["ABC123"], aliases=["pnr", "booking"])
DATE = Param(description="Travel date as YYYY-MM-DD.", examples=["2024-12-20"])

#: Scheduled flights: number -> route and times (the same every day in this demo).
FLIGHTS: dict[str, dict[str, Any]] = {
    "CA1234": {"flight_no": "CA1234", "origin": "PEK", "destination": "SHA", "departs": "08:00", "arrives": "10:15", "aircraft": "A330"},
    "CA1236": {"flight_no": "CA1236", "origin": "PEK", "destination": "SHA", "departs": "13:30", "arrives": "15:45", "aircraft": "A321"},
    "MU5102": {"flight_no": "MU5102", "origin": "PEK", "destination": "SHA", "departs": "18:00", "arrives": "20:10", "aircraft": "B737"},
    "CZ3101": {"flight_no": "CZ3101", "origin": "PEK", "destination": "CAN", "departs": "09:10", "arrives": "12:30", "aircraft": "A350"},
    "CA1235": {"flight_no": "CA1235", "origin": "SHA", "destination": "PEK", "departs": "11:30", "arrives": "13:40", "aircraft": "A330"},
}
#: Seats left per (flight, date); a missing entry means 20 seats.
SEATS: dict[tuple[str, str], int] = {("CA1236", "2024-12-20"): 0, ("MU5102", "2024-12-20"): 3}

BOOKINGS: dict[str, dict[str, Any]] = {
    "ABC123": {"booking_ref": "ABC123", "passenger": "Wang Fang", "flight_no": "CA1234", "date": "2024-12-20",
               "fare_class": "Y", "status": "confirmed"},
    "XYZ789": {"booking_ref": "XYZ789", "passenger": "Tom Baker", "flight_no": "CZ3101", "date": "2024-12-21",
               "fare_class": "J", "status": "confirmed"},
    "LOW001": {"booking_ref": "LOW001", "passenger": "Chen Jie", "flight_no": "CA1234", "date": "2024-12-22",
               "fare_class": "Q", "status": "confirmed"},
}

#: What a fare class allows when rebooking.
POLICIES: dict[str, dict[str, Any]] = {
    "J": {"fare_class": "J", "name": "Business", "free_changes": 2, "change_fee": "0.00", "same_day_only": False},
    "Y": {"fare_class": "Y", "name": "Economy flex", "free_changes": 1, "change_fee": "0.00", "same_day_only": False},
    "Q": {"fare_class": "Q", "name": "Economy saver", "free_changes": 0, "change_fee": "200.00", "same_day_only": True},
}
_lock = threading.Lock()


class FlightDeskError(LookupError):
    pass


def _booking(booking_ref: str) -> dict[str, Any]:
    try:
        return BOOKINGS[booking_ref]
    except KeyError:
        raise FlightDeskError(f"No booking {booking_ref} exists. Ask the user to check the six-character reference.") from None


def _seats(flight_no: str, date: str) -> int:
    return SEATS.get((flight_no, date), 20)


@tool(key="flight_desk.search_flights", category="read")
def search_flights(origin: Annotated[str, AIRPORT], destination: Annotated[str, AIRPORT],
                   date: Annotated[dt.date, DATE]) -> dict[str, Any]:
    """Find flights between two airports on a date, with seats left.

    Use it when the user wants to fly somewhere or asks for alternatives before rebooking.
    Do not use it to look up an existing booking.
    """
    day = date.isoformat()
    found = [
        {**flight, "date": day, "seats_left": _seats(flight["flight_no"], day)}
        for flight in FLIGHTS.values() if flight["origin"] == origin and flight["destination"] == destination
    ]
    return {"origin": origin, "destination": destination, "date": day, "flights": sorted(found, key=lambda f: f["departs"])}


@tool(key="flight_desk.rebooking_policy", category="read")
def rebooking_policy(booking_ref: Annotated[str, BOOKING_REF]) -> dict[str, Any]:
    """Say what a booking's fare allows: free changes, the change fee, whether only same-day changes are allowed.

    Use it before offering a rebooking, so the user hears the fee first. Do not use it to search flights.
    """
    booking = _booking(booking_ref)
    return {"booking_ref": booking_ref, **POLICIES[booking["fare_class"]]}


@tool(key="flight_desk.rebook_flight", category="write", idempotent=False)
def rebook_flight(booking_ref: Annotated[str, BOOKING_REF], new_flight_no: Annotated[str, FLIGHT_NO],
                  date: Annotated[dt.date, DATE]) -> dict[str, Any]:
    """Move a booking to another flight (改签). This changes the ticket: it needs a human's approval; never repeat it.

    Use it only after the user chose the new flight and heard the fee from rebooking_policy.
    Do not use it to search flights or to cancel a booking.
    """
    day = date.isoformat()
    with _lock:
        booking = _booking(booking_ref)
        flight = FLIGHTS.get(new_flight_no)
        if flight is None:
            raise FlightDeskError(f"There is no flight {new_flight_no}. Search flights first and use one of the numbers found.")
        current = FLIGHTS[booking["flight_no"]]
        if (flight["origin"], flight["destination"]) != (current["origin"], current["destination"]):
            raise FlightDeskError(f"{new_flight_no} flies {flight['origin']}-{flight['destination']}, but the booking is for "
                                  f"{current['origin']}-{current['destination']}; a rebooking keeps the route.")
        policy = POLICIES[booking["fare_class"]]
        if policy["same_day_only"] and day != booking["date"]:
            raise FlightDeskError(f"Fare {policy['name']} only allows changes on the same day ({booking['date']}).")
        if _seats(new_flight_no, day) <= 0:
            raise FlightDeskError(f"{new_flight_no} on {day} is full. Offer another flight.")
        SEATS[(new_flight_no, day)] = _seats(new_flight_no, day) - 1
        old = {"flight_no": booking["flight_no"], "date": booking["date"]}
        booking.update(flight_no=new_flight_no, date=day, status="rebooked")
    return {"booking_ref": booking_ref, "previous": old, "flight_no": new_flight_no, "date": day,
            "departs": flight["departs"], "change_fee": policy["change_fee"], "status": "rebooked"}


PLUGIN = PluginSpec(
    key="flight-desk",
    name="Flight desk",
    version="1.0.0",
    description="A ticketing assistant: search flights, explain the rebooking policy, rebook (with approval).",
    tools=(
        PluginTool("flight_desk.search_flights"),
        PluginTool("flight_desk.rebooking_policy"),
        PluginTool("flight_desk.rebook_flight", requires_approval=True, overrides={"required_scopes": ["bookings:change"]}),
    ),
    presets=(
        AgentPreset(
            slug="flight-assistant",
            name="Flight assistant",
            description="Helps travellers find and change flights.",
            system_prompt=("You are the ticketing assistant of an airline. Use the tools for flights and bookings; never invent "
                           "flight numbers, seats or fees. Before rebooking, tell the user the fee from the policy; a rebooking "
                           "needs an approver's confirmation."),
            model="demo/planner",
            tools=("search_flights", "rebooking_policy", "rebook_flight"),
            policy={"limits": {"max_recursion": 8}},
        ),
    ),
    scopes=("bookings:read", "bookings:change"),
    config_schema={
        "type": "object",
        "properties": {
            "airline": {"type": "string", "pattern": "^[A-Z0-9]{2}$", "default": "CA", "description": "Two-letter airline code."},
            "max_change_fee": {"type": "number", "minimum": 0, "description": "Rebookings above this fee need a supervisor."},
        },
        "additionalProperties": False,
    },
)
