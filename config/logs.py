"""Logging filters for ``settings.LOGGING``.

:class:`QuietHousekeeping`: Celery logs every task it sends, receives and finishes at INFO. For the periodic
housekeeping tasks of ``CELERY_BEAT_SCHEDULE`` (the run sweeper, approval expiry, ...) that is a pair of lines every
few seconds in the ``make run`` console that say nothing. The filter drops those routine lines unless the log level
is DEBUG; what the tasks themselves log when they act (e.g. the sweeper's re-enqueue warnings) and any failure still
show.
"""

from __future__ import annotations

import logging

#: Celery's loggers of routine task traffic: beat sending, the worker receiving, the task succeeding.
ROUTINE_LOGGERS = frozenset({"celery.beat", "celery.worker.strategy", "celery.app.trace"})


class QuietHousekeeping(logging.Filter):
    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._tasks: tuple[str, ...] | None = None

    def tasks(self) -> tuple[str, ...]:
        if self._tasks is None:
            from django.conf import settings

            schedule = getattr(settings, "CELERY_BEAT_SCHEDULE", {}) or {}
            names = {str(entry.get("task")) for entry in schedule.values() if entry.get("task")}
            names |= {str(key) for key in schedule}  # beat names the schedule entry ("sweep-runs"), not the task
            self._tasks = tuple(sorted(names))
        return self._tasks

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO or record.name not in ROUTINE_LOGGERS:
            return True
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            return True
        message = record.getMessage()
        return not any(task in message for task in self.tasks())
