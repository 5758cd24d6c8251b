"""Django's PostgreSQL backend, reading ``timestamptz`` with psycopg's compiled loader when the connection is in UTC.

Django registers a timestamptz loader of its own on every connection (``BaseTzLoader``: psycopg's loader written in
Python, then ``replace(tzinfo=…)`` on each value) so that values come back in the database's ``TIME_ZONE``. With that
left at its default (UTC, under ``USE_TZ``) Django also sets every session's ``TimeZone`` to UTC, and then psycopg's
own compiled loader returns the same values: aware datetimes in ``datetime.UTC``. So here a connection is given that
loader instead, and a cursor is not given Django's again. Any other ``TIME_ZONE`` (or ``USE_TZ = False``) keeps
Django's loader. Why: in the API benchmark (issue #14, goal 2) Django's loader was about 4 % of the server's CPU:
every read returns a few timestamps per row (``bench/README.md``). ``tests/db/test_pg_backend.py`` checks the values
are the same, Django's loader against this one.
"""

from __future__ import annotations

import datetime as dt
from functools import cache
from typing import Any

from django.conf import settings
from django.db.backends.postgresql import base
from django.db.backends.postgresql.psycopg_any import get_adapters_template
from psycopg import adapt, adapters
from psycopg.pq import Format

TIMESTAMPTZ_OID = 1184


@cache
def _utc_adapters() -> adapt.AdaptersMap:
    """Django's adapters for UTC, with psycopg's default (compiled, where installed) text loader for timestamptz."""
    ctx = adapt.AdaptersMap(get_adapters_template(True, dt.UTC))
    ctx.register_loader(TIMESTAMPTZ_OID, adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT))
    return ctx


class DatabaseWrapper(base.DatabaseWrapper):
    def _compiled_tz(self) -> bool:
        return bool(settings.USE_TZ) and self.timezone is dt.UTC and self.timezone_name == "UTC"

    def get_connection_params(self) -> dict[str, Any]:
        params = super().get_connection_params()
        if "context" in params and self._compiled_tz():
            params["context"] = _utc_adapters()
        return params

    def create_cursor(self, name: str | None = None) -> Any:
        if not self._compiled_tz():
            return super().create_cursor(name)
        # Django's own would compare the connection's loader's timezone with this wrapper's (the compiled loader has
        # no such attribute) and register its own loader on the cursor where they differ: here they agree, UTC both.
        if not name:
            return self.connection.cursor()
        withhold = self.connection.autocommit  # a named cursor (QuerySet.iterator()), made as Django makes it
        if self.settings_dict["OPTIONS"].get("server_side_binding") is not True:
            return base.ServerSideCursor(self.connection, name=name, scrollable=False, withhold=withhold)
        return self.connection.cursor(name, scrollable=False, withhold=withhold)
