"""A transaction that lost to a concurrent one is run again, not reported as a failure (issue #50).

PostgreSQL ends one of two transactions that wait for each other (``deadlock detected``) and a serializable one whose
reads another changed (``could not serialize access``): nothing of the loser was written, and running it again
normally succeeds. :func:`retried` does that for a unit of work that is its own transaction (a run's step commit, a
flow node's completion, a flow's decision), at most ``DB_CONFLICT_RETRIES`` more times, after a short randomized
wait (so the two do not meet again in step). Inside an enclosing transaction only when the work's own transaction
was a savepoint, rolled back alone; when the enclosing one is aborted, the error goes up to whoever owns it.

The one lock order that keeps deadlocks away in the first place is described in ``audit/chain.py``.
Exceptions are matched by their classes' module and name through ``raise ... from`` causes (Django wraps psycopg's
error in its own ``OperationalError``), as ``core/outages.py`` does, so no driver is imported here.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)

T = TypeVar("T")

#: psycopg's errors for SQLSTATE 40P01 and 40001.
_CONFLICTS = {("psycopg.errors", "DeadlockDetected"), ("psycopg.errors", "SerializationFailure")}
#: The first wait's bound, doubled on each retry, and the longest (seconds).
BASE_WAIT, MAX_WAIT = 0.05, 1.0


def is_conflict(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a deadlock or a serialization failure."""
    for _ in range(8):  # a short chain of causes; never loop on a cycle
        if exc is None:
            return False
        if any((klass.__module__, klass.__qualname__) in _CONFLICTS for klass in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def retried(work: Callable[[], T], *, what: str) -> T:
    """``work()``, run again when it lost a deadlock or a serialization failure (see the module's docstring)."""
    attempt = 0
    while True:
        try:
            return work()
        except Exception as exc:
            if not is_conflict(exc) or connection.needs_rollback or attempt >= settings.DB_CONFLICT_RETRIES:
                raise
            attempt += 1
            wait = random.uniform(0, min(MAX_WAIT, BASE_WAIT * 2 ** (attempt - 1)))  # jitter, not a secret
            log.warning("%s lost to a concurrent transaction (%s); retry %s of %s in %.3f s", what,
                        type(exc.__cause__ or exc).__name__, attempt, settings.DB_CONFLICT_RETRIES, wait)
            time.sleep(wait)
