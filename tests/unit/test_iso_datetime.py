"""agents/serializers.py ``iso_datetime`` writes what DRF's DateTimeField writes, on its fast path (a value already in
the zone, as every value read from the database is) and off it."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from django.utils import timezone
from rest_framework import serializers

from agents.serializers import iso_datetime

PARIS = zoneinfo.ZoneInfo("Europe/Paris")
VALUES = [
    dt.datetime(2026, 12, 7, 10, 11, 12, 345678, tzinfo=dt.UTC),
    dt.datetime(2026, 12, 7, 10, 11, 12, tzinfo=dt.UTC),
    dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.UTC),  # Paris changes its clocks at this hour
    dt.datetime(2026, 7, 1, 23, 0, tzinfo=PARIS),
    dt.datetime(2026, 7, 1, 23, 0, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30))),
    dt.datetime(2026, 7, 1, 23, 0, tzinfo=zoneinfo.ZoneInfo("UTC")),
]


@pytest.mark.parametrize("current", ["UTC", "Europe/Paris"])
@pytest.mark.parametrize("value", VALUES, ids=str)
def test_it_writes_what_drf_writes(current: str, value: dt.datetime) -> None:
    with timezone.override(current):
        expected = serializers.DateTimeField().to_representation(value)
        assert iso_datetime(value) == expected
        assert iso_datetime(value, timezone.get_current_timezone()) == expected


def test_nothing_is_none_and_a_naive_value_is_written_as_it_is() -> None:
    assert iso_datetime(None) is None
    assert iso_datetime(dt.datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05"


def test_the_fast_path_is_taken_for_the_utc_zone_django_hands_out() -> None:
    """The fast path compares zones by identity: Django's UTC zone must be the very object it checks for."""
    from agents import serializers as module

    with timezone.override("UTC"):
        assert timezone.get_current_timezone() is module._UTC_ZONE
    assert timezone.get_default_timezone_name() != "UTC" or timezone.get_default_timezone() is module._UTC_ZONE
