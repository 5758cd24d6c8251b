"""Celery's routine lines about the periodic housekeeping tasks stay out of the console unless LOG_LEVEL is DEBUG."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from config.logs import QuietHousekeeping


def _record(logger: str, level: int, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(logger, level, __file__, 1, msg, args, None)


@pytest.fixture
def root_at_info() -> Iterator[None]:
    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.INFO)
    yield
    root.setLevel(before)


def test_routine_housekeeping_lines_are_dropped_at_info(root_at_info: None) -> None:
    quiet = QuietHousekeeping()
    assert not quiet.filter(_record("celery.beat", logging.INFO, "Scheduler: Sending due task %s (%s)", "sweep-runs",
                                    "agents.sweep_runs"))
    assert not quiet.filter(_record("celery.worker.strategy", logging.INFO, "Task %s[%s] received", "agents.sweep_runs", "x"))
    assert not quiet.filter(_record("celery.app.trace", logging.INFO, "Task %s[%s] succeeded in %ss: %r",
                                    "tools.expire_approvals", "y", 0.01, 0))


def test_what_the_tasks_do_and_every_other_task_still_shows(root_at_info: None) -> None:
    quiet = QuietHousekeeping()
    assert quiet.filter(_record("agents.sweeper", logging.WARNING, "run %s: queued for over %ss with no worker; re-enqueued", "r", 60))
    assert quiet.filter(_record("celery.app.trace", logging.ERROR, "Task %s[%s] raised unexpected: %r", "agents.sweep_runs", "z",
                                "boom"))
    assert quiet.filter(_record("celery.worker.strategy", logging.INFO, "Task %s[%s] received", "agents.execute_run", "w"))


def test_debug_shows_the_routine_lines_again() -> None:
    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.DEBUG)
    try:
        assert QuietHousekeeping().filter(_record("celery.worker.strategy", logging.INFO, "Task %s[%s] received",
                                                  "agents.sweep_runs", "x"))
    finally:
        root.setLevel(before)
