"""Shared test setup. Under CI the suite must run its integration tests against real services: never skip."""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

logging.getLogger("httpx").setLevel(logging.WARNING)

#: The live stack (a real server and worker) is shared by the integration and browser tests: one session instance;
#: the streaming tests' stack (its provider the streaming test server) is one per module.
pytest_plugins = ["tests.support.live_stack", "tests.support.stream_stack"]

IN_CI = os.environ.get("CI", "").lower() == "true"

# A fast password hasher for the whole suite, this process and the live stack's (which inherit the environment):
# PBKDF2 costs about a second a hash here and was ~80 % of the db suite's time (healthchecks does the same).
os.environ.setdefault("PASSWORD_HASHERS", "django.contrib.auth.hashers.MD5PasswordHasher")


def _worker_redis_url(url: str, worker: str) -> str:
    """``url`` with the Redis database of pytest-xdist worker ``gwN``: the URL's own database number plus N.

    Every worker has a test database of its own (pytest-django suffixes its name), whose rows repeat the other
    workers' ids; the state kept in Redis is keyed by those ids (rate-limit buckets, the API key cache, open-stream
    slots, worker heartbeats, the channel layer's groups, the broker's queues) and the throttle tests empty the
    database with ``cache.clear()``. So each worker gets a Redis database of its own as well, not just a key prefix."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or parts.query:
        raise pytest.UsageError(f"REDIS_URL {url!r}: under pytest-xdist each worker needs a database of its own; "
                                "give a redis://host:port/N URL (N the first worker's database).")
    database = int(parts.path.strip("/") or 0) + int(worker.removeprefix("gw"))
    if database > 15:  # redis-server's default number of databases
        raise pytest.UsageError(f"REDIS_URL {url!r}: worker {worker} would use Redis database {database} (> 15); "
                                "run fewer workers (-n, TEST_WORKERS) or start REDIS_URL at a lower database.")
    return parts._replace(path=f"/{database}").geturl()


_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _XDIST_WORKER and os.environ.get("REDIS_URL"):
    # This process's, its subprocesses' (the live stack inherits the environment) and, below, its settings'.
    os.environ["REDIS_URL"] = _worker_redis_url(os.environ["REDIS_URL"], _XDIST_WORKER)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-django has read the settings before this module was imported: name the hasher to them as well.
    from django.conf import settings

    settings.PASSWORD_HASHERS = [name.strip() for name in os.environ["PASSWORD_HASHERS"].split(",") if name.strip()]
    worker_url = os.environ.get("REDIS_URL")
    if settings.REDIS_URL and worker_url != settings.REDIS_URL:
        # An xdist worker's own Redis database (above): every setting derived from REDIS_URL (the cache, the channel
        # layer, the broker...) as the settings module derives it from the new URL. Nothing has connected yet.
        module = importlib.reload(importlib.import_module(os.environ["DJANGO_SETTINGS_MODULE"]))
        for name in dir(module):
            if name.isupper() and getattr(module, name) != getattr(settings, name, None):
                setattr(settings, name, getattr(module, name))
        assert worker_url == settings.REDIS_URL


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
        # Under `-n N --dist loadgroup` (make test) a module runs whole on one worker, in its order as serially,
        # and builds its module-scoped fixtures once rather than once on each worker its tests were spread over.
        item.add_marker(pytest.mark.xdist_group(str(item.path)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A skip in CI hides a missing service; treat it as a failure there.
    if IN_CI and report.skipped and "integration" in report.keywords:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which is not allowed for integration tests: {report.longrepr}"


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment: None, django_db_modify_db_settings: None,
                    django_db_blocker: Any) -> Iterator[None]:
    """The test database, always created: the live-stack tests need it without using the ``db`` fixture. Under
    pytest-xdist each worker has its own (pytest-django's django_db_modify_db_settings suffixes the name: _gw0...)."""
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():
        config = setup_databases(verbosity=0, interactive=False, aliases={"default"}, serialized_aliases=set())
    yield
    with django_db_blocker.unblock():
        teardown_databases(config, verbosity=0)


@pytest.fixture(autouse=True)
def _fresh_refunds() -> Iterator[None]:
    """The demo refund tool keeps its refunds in memory (per process): every test starts with none issued."""
    from marketplace.builtin import order_desk

    order_desk.REFUNDS.clear()
    yield
    order_desk.REFUNDS.clear()
