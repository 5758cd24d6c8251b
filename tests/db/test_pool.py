"""Issue #14, goal 1: a bounded database pool per process; past its capacity a request is a fast 503, never a 500.

The pool itself is exercised on a live server in tests/integration/test_pool_capacity.py; here: the settings that
configure it (in a subprocess, whatever database this run uses) and the one error map's answer to the pool's refusals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg_pool
import pytest
from django.db import connection
from django.db.utils import OperationalError
from rest_framework.test import APIClient

from core import outages
from tenants.models import Tenant
from tests.factories import make_world

ROOT = Path(__file__).resolve().parents[2]

_PRINT_DATABASES = "import json, django; django.setup(); from django.conf import settings; print(json.dumps(settings.DATABASES['default']))"


def _settings(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("DB_POOL_", "DB_PREPARE_")) and k != "DATABASE_URL"}
    full.update(DJANGO_SETTINGS_MODULE="config.settings", DEBUG="false", SECRET_KEY="s" * 40, **env)
    return subprocess.run([sys.executable, "-c", _PRINT_DATABASES], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=60)


def _database(env: dict[str, str]) -> dict[str, Any]:
    result = _settings(env)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_postgresql_connections_come_from_a_bounded_health_checked_pool_sized_by_the_environment() -> None:
    db = _database({"DATABASE_URL": "postgres://app@db.internal:5432/agentops", "DB_POOL_MAX_SIZE": "7",
                    "DB_POOL_MIN_SIZE": "3", "DB_POOL_TIMEOUT": "1.5", "DB_POOL_MAX_WAITING": "20"})
    pool = db["OPTIONS"]["pool"]
    assert (pool["max_size"], pool["min_size"], pool["timeout"], pool["max_waiting"]) == (7, 3, 1.5, 20)
    assert db["CONN_MAX_AGE"] == 0  # Django's pool: "closing" returns the connection to the pool, per request and task
    assert db["CONN_HEALTH_CHECKS"] is True  # with the pool: each connection is checked as it is lent out


def test_the_pool_has_defaults_and_its_minimum_never_exceeds_its_maximum() -> None:
    pool = _database({"DATABASE_URL": "postgres://app@db.internal:5432/agentops"})["OPTIONS"]["pool"]
    assert pool["max_size"] == 10 and 0 < pool["timeout"] <= 5 and pool["max_waiting"] > 0
    assert _database({"DATABASE_URL": "postgres://app@db.internal/x", "DB_POOL_MAX_SIZE": "2", "DB_POOL_MIN_SIZE": "5"}
                     )["OPTIONS"]["pool"]["min_size"] == 2


def test_postgresql_parameters_are_bound_by_the_server_and_hot_statements_prepared() -> None:
    options = _database({"DATABASE_URL": "postgres://app@db.internal/x"})["OPTIONS"]
    assert options["server_side_binding"] is True and options["prepare_threshold"] == 5
    assert _database({"DATABASE_URL": "postgres://app@db.internal/x", "DB_PREPARE_THRESHOLD": "0"}
                     )["OPTIONS"]["prepare_threshold"] == 0
    assert _database({"DATABASE_URL": "postgres://app@db.internal/x", "DB_PREPARE_THRESHOLD": "off"}
                     )["OPTIONS"]["prepare_threshold"] is None  # for a pooler in transaction mode


@pytest.mark.django_db
def test_a_statement_run_often_on_a_connection_is_prepared_there_on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's prepared statements (CI's database suite runs on PostgreSQL)")
    world = make_world()
    for _ in range(6):  # past DB_PREPARE_THRESHOLD (5)
        assert Tenant.objects.filter(pk=world.tenant.pk).values_list("slug", flat=True).first() == world.tenant.slug
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any('FROM "tenants_tenant"' in text and "$1" in text for text in prepared), prepared


def test_sqlite_keeps_its_embedded_settings_without_a_pool() -> None:
    db = _database({})
    assert db["ENGINE"] == "django.db.backends.sqlite3" and "pool" not in db["OPTIONS"]
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


@pytest.mark.parametrize(("name", "value"), [("DB_POOL_MAX_SIZE", "many"), ("DB_POOL_TIMEOUT", "soon"),
                                             ("DB_POOL_TIMEOUT", "0"), ("DB_POOL_MAX_WAITING", "-1"),
                                             ("DB_PREPARE_THRESHOLD", "sometimes"), ("DB_PREPARE_THRESHOLD", "-1")])
def test_a_bad_pool_setting_stops_start_up_naming_the_variable(name: str, value: str) -> None:
    result = _settings({"DATABASE_URL": "postgres://app@db.internal/x", name: value})
    assert result.returncode != 0 and name in result.stderr


def _pool_refusal(kind: type[Exception]) -> OperationalError:
    """What a query raises when the pool has no connection for it: Django's error, raised from the pool's."""
    try:
        try:
            raise kind("couldn't get a connection after 3.00 sec")
        except kind as exc:
            raise OperationalError(str(exc)) from exc
    except OperationalError as wrapped:
        return wrapped


def test_the_pools_refusals_are_told_from_an_outage() -> None:
    for kind in (psycopg_pool.PoolTimeout, psycopg_pool.TooManyRequests):
        assert outages.dependency_down(_pool_refusal(kind)) == outages.DATABASE_BUSY
        assert outages.dependency_down(kind("bare")) == outages.DATABASE_BUSY
    assert outages.dependency_down(OperationalError("connection refused")) == outages.DATABASE
    assert outages.body(outages.DATABASE_BUSY)["error"]["dependency"] == "database"


@pytest.mark.django_db
def test_a_request_that_gets_no_pooled_connection_is_a_503_with_retry_after_in_the_error_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = make_world()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    assert client.get("/api/v1/runs").status_code == 200

    def pool_exhausted(*args: Any, **kwargs: Any) -> Any:
        raise _pool_refusal(psycopg_pool.PoolTimeout)

    # given every pooled connection is busy (the view's first query waits DB_POOL_TIMEOUT, then the pool refuses)
    monkeypatch.setattr(connection, "create_cursor", pool_exhausted)
    # when a client reads its runs
    response = client.get("/api/v1/runs")
    # then it is told to come back, in the one error body, never a 500
    assert response.status_code == 503, response.content[:300]
    assert response["Retry-After"] == str(outages.BUSY_RETRY_AFTER_SECONDS)
    body = response.json()
    assert body["error"] == {"code": "dependency_unavailable", "message": body["detail"], "field": None,
                             "dependency": "database"}
    assert "capacity" in body["detail"]
