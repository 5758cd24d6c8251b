"""config/pg_timestamps.py: on a UTC connection of Django's own backend timestamps are read by psycopg's compiled
loader (registered through psycopg's API when the connection is made), and what it returns is what Django's own loader
returned, value for value (tzinfo included); any other database TIME_ZONE keeps Django's. PostgreSQL only (CI runs
it)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader

from agents.models import Run, Session
from config import pg_timestamps
from tests.factories import make_world

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL backend's (CI runs it)"),
]

AWKWARD = [
    "2026-12-07 10:11:12.345678+00", "2026-03-29 01:59:59.999999+00", "2026-10-25 02:30:00+02", "0001-01-01 00:00:00+00",
    "9999-12-31 23:59:59.999999+00", "2000-02-29 12:00:00-11:30", "1969-12-31 23:59:59.5+00", "2026-06-01 00:00:00+14",
]
SQL = "SELECT v::timestamptz FROM unnest(%s::text[]) AS v"


def _read(register_djangos: bool) -> list[dt.datetime]:
    with connection.cursor() as cursor:
        if register_djangos:  # what Django's backend puts on every connection
            register_tzloader(dt.UTC, cursor.cursor)
        cursor.execute(SQL, [AWKWARD])
        return [row[0] for row in cursor.fetchall()]


def test_timestamps_read_by_the_compiled_loader_equal_djangos_value_for_value() -> None:
    connection.ensure_connection()
    assert connection.settings_dict["ENGINE"] == "django.db.backends.postgresql"  # Django's backend, as shipped
    assert connection.connection.adapters.get_loader(1184, 0) is pg_timestamps.UTCTimestampLoader
    assert pg_timestamps._COMPILED.__module__.endswith("._psycopg")  # compiled (psycopg_binary or psycopg_c)
    with connection.cursor() as cursor:  # Django's create_cursor found the zones agree: no loader of its own on a cursor
        assert cursor.cursor.adapters.get_loader(1184, 0) is pg_timestamps.UTCTimestampLoader
    ours, djangos = _read(False), _read(True)
    assert ours == djangos
    assert [(v.isoformat(), v.tzinfo) for v in ours] == [(v.isoformat(), v.tzinfo) for v in djangos]
    assert all(v.tzinfo is dt.UTC for v in ours)
    assert ours[0] == dt.datetime(2026, 12, 7, 10, 11, 12, 345678, tzinfo=dt.UTC)
    assert ours[2] == dt.datetime(2026, 10, 25, 0, 30, tzinfo=dt.UTC)


def test_the_orm_reads_aware_utc_datetimes_through_plain_and_named_cursors() -> None:
    world = make_world()
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    for _ in range(3):
        Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input="x")
    plain = sorted(Run.objects.filter(session=session).values_list("created_at", flat=True))
    named = sorted(r.created_at for r in Run.objects.filter(session=session).iterator(chunk_size=2))  # a server-side cursor
    assert plain == named and len(plain) == 3
    assert all(v.tzinfo is dt.UTC for v in plain)


def test_another_database_time_zone_keeps_djangos_loader() -> None:
    other = connection.copy()
    other.settings_dict = {**connection.settings_dict, "TIME_ZONE": "Europe/Paris"}
    try:
        assert not pg_timestamps.in_utc(other)
        pg_timestamps.register(sender=None, connection=other)  # not connected: registering would fail on None
        context = other.get_connection_params()["context"]
        assert context.get_loader(1184, 0).timezone.key == "Europe/Paris"  # Django's, on the database's zone
    finally:
        other.close()
