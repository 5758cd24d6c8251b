"""A dependency that is down is a 503 with ``Retry-After``, never a 500 (issue #13).

With PostgreSQL or Redis unreachable, a request fails with the driver's connection error. This module says which
dependency that was (:func:`dependency_down`) and answers for every entry point, in one shape:

- the API: ``core.api.exception_handler`` (DRF catches a view's exceptions before any middleware sees them);
- every other view (console, approvals, admin, ``/healthz``): :class:`OutageMiddleware`'s ``process_exception``;
- anything raised in a middleware: ``core.api.server_error`` (``handler500``, when ``DEBUG`` is off).

The body is the API's error shape plus a machine-readable part::

    {"detail": "The database is unavailable; retry shortly.",
     "error": {"code": "dependency_unavailable", "message": "...", "field": null, "dependency": "database"}}

``dependency`` is ``database`` or ``redis`` (the Celery broker, the cache behind rate limits, the channel layer).
A database that is up but whose connection pool is exhausted (every pooled connection lent out for longer than
``DB_POOL_TIMEOUT``, or ``DB_POOL_MAX_WAITING`` requests already queued: the server is past its capacity) is the same
503 for ``database``, with a message saying so and a shorter ``Retry-After``.
A request that lost a deadlock or a serialization failure to a concurrent one (the database is up; nothing of the
request was written) is a 503 too, with code ``conflict_retry``, no ``dependency`` and a message that says so, never
that the database is down (``core/conflicts.py``).
Pages that are not the API get a short HTML page with the same status and header.

Exceptions are matched by their classes' module and name (through ``raise ... from`` causes), so neither redis nor
kombu is imported here: settings import this module's users, and importing redis loads the OpenTelemetry SDK.
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin
from django.utils.html import escape

from core.conflicts import is_conflict

log = logging.getLogger(__name__)

#: Seconds a client should wait before retrying (the ``Retry-After`` header).
RETRY_AFTER_SECONDS = 5
#: ... when the database is up but every pooled connection is busy: capacity comes back as soon as requests finish.
BUSY_RETRY_AFTER_SECONDS = 2

DATABASE, REDIS = "database", "redis"
#: Not a dependency of its own: the database, reachable, but no pooled connection free in time (over capacity).
DATABASE_BUSY = "database_busy"
#: Not a dependency either: the database answered, but a statement or a wait for a lock passed its bound
#: (DB_STATEMENT_TIMEOUT_SECONDS, DB_LOCK_TIMEOUT_SECONDS): contention, not an outage.
DATABASE_SLOW = "database_slow"
#: Not a dependency either: this server process already has MAX_CONCURRENT_REQUESTS requests in progress
#: (core/admission.py refuses the next one before Django sees it).
SERVER_BUSY = "server_busy"
#: Not an outage: the database rolled this request's transaction back in favour of a concurrent one (a deadlock, a
#: serialization failure); the same request again normally succeeds.
DATABASE_CONFLICT = "database_conflict"

_KNOWN: dict[tuple[str, str], str] = {
    ("django.db.utils", "OperationalError"): DATABASE,
    ("django.db.utils", "InterfaceError"): DATABASE,
    ("psycopg", "OperationalError"): DATABASE,  # the driver's own, should one escape Django's wrapper
    ("psycopg", "InterfaceError"): DATABASE,
    ("redis.exceptions", "ConnectionError"): REDIS,  # and its subclasses (BusyLoadingError, ...)
    ("redis.exceptions", "TimeoutError"): REDIS,
    ("kombu.exceptions", "OperationalError"): REDIS,  # Celery's publish when the broker is unreachable
    # The pool (psycopg_pool, behind Django's OperationalError): no connection free within the timeout, or too many
    # requests already waiting for one.
    ("psycopg_pool", "PoolTimeout"): DATABASE_BUSY,
    ("psycopg_pool", "TooManyRequests"): DATABASE_BUSY,
    # PostgreSQL cut a statement at statement_timeout, or a lock wait at lock_timeout.
    ("psycopg.errors", "QueryCanceled"): DATABASE_SLOW,
    ("psycopg.errors", "LockNotAvailable"): DATABASE_SLOW,
}

_MESSAGES = {
    DATABASE: "The database is unavailable; retry shortly.",
    REDIS: "Redis (the broker, cache and channel layer) is unavailable; retry shortly.",
    # The pool cannot tell the two apart: with PostgreSQL down it keeps reconnecting in the background and the request
    # waits for DB_POOL_TIMEOUT just the same.
    DATABASE_BUSY: "No database connection became free in time: the server is at capacity, or the database is "
                   "unreachable. Retry shortly.",
    SERVER_BUSY: "The server is at capacity: too many requests in progress. Retry shortly.",
    DATABASE_SLOW: "The database is busy: this request waited too long for a statement or a lock (other work holds "
                   "what it needs). Retry shortly.",
    DATABASE_CONFLICT: "The request was rolled back in a conflict with concurrent work (a deadlock or serialization "
                       "failure); nothing of it was saved. Retry it, with the same Idempotency-Key.",
}


def dependency_down(exc: BaseException | None) -> str | None:
    """``"database"`` or ``"redis"`` when ``exc`` (or an exception it was raised from) says that one is unreachable;
    ``"database_busy"`` when the database's connection pool had no connection free in time (Django wraps the pool's
    error in its own OperationalError, so the whole chain of causes is read and the pool's verdict wins);
    ``"database_conflict"`` when it lost a deadlock or serialization failure (the database is up)."""
    if is_conflict(exc):
        return DATABASE_CONFLICT
    first = None
    for _ in range(8):  # a short chain of explicit causes; never loop on a cycle
        if exc is None:
            break
        for klass in type(exc).__mro__:
            found = _KNOWN.get((klass.__module__, klass.__qualname__))
            if found is not None:
                if found in (DATABASE_BUSY, DATABASE_SLOW):  # more precise than the wrapper's "database"
                    return found
                first = first or found
                break
        exc = exc.__cause__
    return first


_NAMED: dict[str, str | None] = {DATABASE_BUSY: DATABASE, DATABASE_SLOW: DATABASE, SERVER_BUSY: "server",
                                  DATABASE_CONFLICT: None}


def body(dependency: str) -> dict[str, Any]:
    message = _MESSAGES[dependency]
    code = "conflict_retry" if dependency == DATABASE_CONFLICT else "dependency_unavailable"
    return {"detail": message, "error": {"code": code, "message": message, "field": None,
                                         "dependency": _NAMED.get(dependency, dependency)}}


def headers(dependency: str | None = None) -> dict[str, str]:
    quick = (DATABASE_BUSY, DATABASE_SLOW, SERVER_BUSY, DATABASE_CONFLICT)
    wait = BUSY_RETRY_AFTER_SECONDS if dependency in quick else RETRY_AFTER_SECONDS
    return {"Retry-After": str(wait), "Cache-Control": "no-store"}


def log_outage(request: HttpRequest | None, dependency: str, exc: BaseException) -> None:
    path = request.path if request is not None else "?"
    log.warning("%s unavailable: %s %s answered 503 (%s: %s)", dependency, getattr(request, "method", "?"), path,
                type(exc).__name__, exc)


def _wants_json(request: HttpRequest) -> bool:
    if request.path.startswith(("/api/", "/healthz", "/metrics")):
        return True
    accept = request.headers.get("Accept", "")
    return "json" in accept or "html" not in accept


def outage_response(request: HttpRequest, exc: BaseException | None) -> HttpResponse | None:
    """The 503 for ``exc`` if it is an outage, else None."""
    dependency = dependency_down(exc)
    if exc is None or dependency is None:
        return None
    log_outage(request, dependency, exc)
    if _wants_json(request):
        return JsonResponse(body(dependency), status=503, headers=headers(dependency))
    message = escape(_MESSAGES[dependency])
    page = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Temporarily unavailable</title></head>"
            f"<body><h1>Temporarily unavailable</h1><p>{message}</p><p>This page will work again once it is back; "
            f"reload in {headers(dependency)['Retry-After']} seconds.</p></body></html>")
    return HttpResponse(page, status=503, headers=headers(dependency), content_type="text/html; charset=utf-8")


class OutageMiddleware(MiddlewareMixin):
    """A view (not the API's, DRF answers those itself) that failed because a dependency is down answers 503."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return outage_response(request, exception)
