from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest

from runtime.types import ToolSpec
from tests.support.fake_openai import FakeOpenAI

ORDER_ID = {"type": "string", "pattern": r"^O\d{12}$", "description": "The order number, e.g. O202411280001"}


def order_tools() -> list[ToolSpec]:
    one_order = {"type": "object", "properties": {"order_id": ORDER_ID}, "required": ["order_id"]}
    return [
        ToolSpec("query_order", "Look up an order's status, items and total amount.", one_order),
        ToolSpec("query_logistics", "Track the shipment of an order: carrier, current location, ETA.", one_order),
        ToolSpec(
            "sum_order_totals",
            "Add up the totals of several orders.",
            {
                "type": "object",
                "properties": {"order_ids": {"type": "array", "items": {"type": "string", "pattern": r"^O\d{12}$"}}},
                "required": ["order_ids"],
            },
        ),
        ToolSpec(
            "refund_order",
            "Refund an order to the original payment method.",
            {
                "type": "object",
                "properties": {"order_id": ORDER_ID, "reason": {"type": "string"}},
                "required": ["order_id"],
            },
        ),
    ]


def flight_tools() -> list[ToolSpec]:
    return [
        ToolSpec(
            "search_flights",
            "Search available flights between two cities on a date.",
            {
                "type": "object",
                "properties": {
                    "origin": {"type": "string"},
                    "destination": {"type": "string"},
                    "date": {"type": "string", "format": "date"},
                },
                "required": ["origin", "destination", "date"],
            },
        ),
        ToolSpec(
            "rebook_flight",
            "Rebook a booking onto another flight.",
            {
                "type": "object",
                "properties": {
                    "booking_ref": {"type": "string"},
                    "flight_no": {"type": "string", "pattern": r"^[A-Z]{2}\d{3,4}$"},
                },
                "required": ["booking_ref", "flight_no"],
            },
        ),
    ]


@pytest.fixture
def tools() -> list[ToolSpec]:
    return order_tools() + flight_tools()


@pytest.fixture
def clock() -> datetime:
    return datetime(2024, 11, 27, 9, 30)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(api_key="sk-fake-provider-key-0123456789", models=["small", "large"]).start()
    yield server
    server.stop()


@pytest.fixture
def backup() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(api_key="sk-backup-provider-key-987654321", models=["small"]).start()
    yield server
    server.stop()
