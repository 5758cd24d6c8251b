"""Issue #12: embedded mode runs Celery's own worker (what ``celery worker`` runs), not the test suite's controller."""

from __future__ import annotations

import inspect

from celery.worker import WorkController

from config import embedded


def test_the_embedded_worker_is_celerys_worker_not_a_test_helper() -> None:
    assert issubclass(embedded.EmbeddedWorker, WorkController)
    assert "celery.contrib.testing" not in inspect.getsource(embedded)
