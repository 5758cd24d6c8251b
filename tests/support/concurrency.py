"""Two transactions at once, for tests of what a lock serializes (PostgreSQL).

``other_transaction()`` opens a second connection to the test database, outside Django, on which a test does what a
concurrent writer does and leaves it uncommitted. ``waits_for(action, release)`` runs the code under test on a thread,
checks it is blocked (else the race the test is about was never exercised), releases the other transaction and
returns what the action returned, or raises what it raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import psycopg
from django.db import connection, connections

T = TypeVar("T")


@contextmanager
def other_transaction() -> Iterator[psycopg.Connection]:
    """A second connection to the test database (its transaction is left to the test to commit), closed after."""
    db = connection.settings_dict
    other = psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"])
    try:
        yield other
    finally:
        other.close()


def waits_for(action: Callable[[], T], release: Callable[[], None], *, what: str, blocked: float = 2.0,
              timeout: float = 30.0) -> T:
    """Run ``action`` on a thread; it must still be running after ``blocked`` seconds (``what`` says what it should
    be waiting for), then ``release()`` is called and the action must finish within ``timeout``."""
    outcome: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:  # re-raised in the test's thread below
            errors.append(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(blocked)
    assert worker.is_alive(), f"it did not wait for {what}: nothing concurrent was tested"
    release()
    worker.join(timeout)
    assert not worker.is_alive(), f"still running {timeout} s after {what} was released"
    if errors:
        raise errors[0]
    return outcome[0]
