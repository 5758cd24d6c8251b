"""PostgreSQL connections in UTC read ``timestamptz`` with psycopg's compiled loader, registered through psycopg's API.

Django's backend reads every ``timestamptz`` with a loader written in Python (``BaseTzLoader``: psycopg's Python
loader, then ``replace(tzinfo=…)``), about 4 µs a value here against 0.4 µs this way (docs/decisions/timestamp-
loader.md); an API page of runs reads a few hundred. With ``USE_TZ`` and the database ``TIME_ZONE`` left at UTC,
Django sets every session's ``TimeZone`` to UTC, and psycopg's own compiled loader then returns the same values:
aware datetimes in ``datetime.UTC``. So each new connection (Django's ``connection_created`` signal, sent for every
connection Django opens or borrows from the pool) gets that loader with ``connection.adapters.register_loader``, the
public psycopg API; any other time zone keeps Django's loader untouched.

The compiled loader is a C type that cannot be subclassed, and Django's ``create_cursor`` compares the connection's
loader's ``timezone`` with its own before it puts its loader on a cursor: :class:`UTCTimestampLoader` is a thin
psycopg ``Loader`` that says it reads in UTC and hands each value to the compiled one. If Django stops reading that
attribute it registers its own loader on the cursor again: slower, never wrong (``tests/db/test_pg_backend.py``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db.backends.signals import connection_created
from psycopg import adapters
from psycopg.adapt import Loader
from psycopg.pq import Format

TIMESTAMPTZ_OID = 1184
#: psycopg's default text loader for timestamptz: the compiled one where psycopg_binary or psycopg_c is installed
_COMPILED: Any = adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)


class UTCTimestampLoader(Loader):
    """psycopg's compiled timestamptz loader on a connection whose session time zone is UTC."""

    timezone = dt.UTC  # what Django's create_cursor compares with the connection's zone (they agree: no cursor loader)

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self.load = _COMPILED(oid, context).load  # type: ignore[method-assign]

    def load(self, data: Any) -> Any:  # replaced per instance by the compiled loader's
        raise NotImplementedError


def in_utc(connection: Any) -> bool:
    """Whether Django's wrapper reads timestamps in UTC (then the compiled loader returns what Django's would)."""
    return connection.vendor == "postgresql" and bool(settings.USE_TZ) and connection.timezone_name == "UTC"


def register(sender: Any, connection: Any, **kwargs: Any) -> None:
    if in_utc(connection):
        connection.connection.adapters.register_loader(TIMESTAMPTZ_OID, UTCTimestampLoader)


def connect() -> None:
    connection_created.connect(register, dispatch_uid="agentops-utc-timestamps")
