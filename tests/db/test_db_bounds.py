"""Issue #50: a statement or a lock wait has a bound per process role, and a request past it is a 503 with
Retry-After that says the database is busy (not down), never a 500 and never a request that holds its pooled
connection for as long as another transaction holds the lock."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from agents import services
from config import dbroles
from core import outages
from tenants.scoping import Actor
from tests.factories import make_world

needs_postgresql = pytest.mark.skipif(connection.vendor != "postgresql",
                                      reason="statement_timeout and lock_timeout are PostgreSQL's (SQLite has neither)")


def test_a_lock_or_statement_timeout_is_answered_as_a_busy_database_not_an_outage() -> None:
    from django.db.utils import OperationalError

    for name in ("QueryCanceled", "LockNotAvailable"):
        cause = getattr(psycopg.errors, name)("canceling statement due to lock timeout")
        wrapped = OperationalError(str(cause))
        wrapped.__cause__ = cause
        assert outages.dependency_down(wrapped) == outages.DATABASE_SLOW
        assert "busy" in outages.body(outages.DATABASE_SLOW)["detail"]
        assert outages.body(outages.DATABASE_SLOW)["error"]["dependency"] == "database"
        assert outages.headers(outages.DATABASE_SLOW)["Retry-After"] == str(outages.BUSY_RETRY_AFTER_SECONDS)
    assert outages.dependency_down(psycopg.OperationalError("connection refused")) == outages.DATABASE


@needs_postgresql
@pytest.mark.django_db
def test_a_server_connection_carries_the_request_bounds() -> None:
    options = settings.DATABASES["default"]["OPTIONS"]["options"]
    assert f"statement_timeout={round(settings.DB_STATEMENT_TIMEOUT_SECONDS * 1000)}" in options
    assert f"lock_timeout={round(settings.DB_LOCK_TIMEOUT_SECONDS * 1000)}" in options
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == f"{round(settings.DB_LOCK_TIMEOUT_SECONDS)}s"


@needs_postgresql
@pytest.mark.django_db
def test_a_worker_connection_gets_the_worker_bounds(settings: Any) -> None:
    settings.WORKER_DB_LOCK_TIMEOUT_SECONDS = 42.0
    dbroles._worker_bounds(sender=None, connection=connection)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] == "42s"
    finally:  # the pooled connection goes on to other tests: back to the bounds it was opened with
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")
            cursor.execute("RESET lock_timeout")


@needs_postgresql
@pytest.mark.django_db(transaction=True)
def test_a_request_behind_a_held_lock_is_a_fast_503_with_retry_after() -> None:
    w = make_world()
    run = services.start_run(actor=Actor(api_key=w.key), agent=w.agent, text="Where is my order O202411280001?")
    dsn = connection.get_connection_params()
    holder = psycopg.connect(dbname=dsn["dbname"], user=dsn.get("user"), host=dsn.get("host"), port=dsn.get("port"))
    try:
        holder.execute("SELECT 1 FROM agents_run WHERE id = %s FOR UPDATE", [run.pk])  # held, transaction open
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '300ms'")  # the request bound, shortened for the test
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {w.raw_key}")
        started = time.monotonic()
        answer = client.post(f"/api/v1/runs/{run.pk}/cancel")
        waited = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
        with connection.cursor() as cursor:  # the pooled connection goes on to other tests with its own bound again
            cursor.execute("RESET lock_timeout")
    assert answer.status_code == 503, answer.content
    assert answer["Retry-After"] == str(outages.BUSY_RETRY_AFTER_SECONDS)
    assert answer.json()["error"]["dependency"] == "database" and "busy" in answer.json()["detail"]
    assert waited < 3, f"the request waited {waited:.1f} s for the lock"
