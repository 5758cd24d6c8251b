"""Statement and lock bounds per process role on PostgreSQL.

A server process's connections carry the request bounds (``DB_STATEMENT_TIMEOUT_SECONDS``, ``DB_LOCK_TIMEOUT_SECONDS``)
as connection options (config/settings.py), at no cost per request. A separate Celery worker process runs longer
tasks: each connection it borrows is given the ``WORKER_`` bounds when Django opens it (``connection_created``, one
statement per task). The embedded worker shares the server's process and keeps the request bounds.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.backends.signals import connection_created


def _worker_bounds(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)",
                       [f"{round(settings.WORKER_DB_STATEMENT_TIMEOUT_SECONDS * 1000)}",
                        f"{round(settings.WORKER_DB_LOCK_TIMEOUT_SECONDS * 1000)}"])


def use_worker_timeouts() -> None:
    """From now on this process's database connections get the worker's bounds (a separate worker only)."""
    if settings.EMBEDDED or not hasattr(settings, "WORKER_DB_STATEMENT_TIMEOUT_SECONDS"):
        return
    connection_created.connect(_worker_bounds, dispatch_uid="agentops-worker-db-bounds")
