"""Shared test setup. Under CI the suite must run its integration tests against real services: never skip."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

logging.getLogger("httpx").setLevel(logging.WARNING)

#: The live stack (a real server and worker) is shared by the integration and browser tests: one session instance;
#: the streaming tests' stack (its provider the streaming test server) is one per module.
pytest_plugins = ["tests.support.live_stack", "tests.support.stream_stack"]

IN_CI = os.environ.get("CI", "").lower() == "true"

# A fast password hasher for the whole suite, this process and the live stack's (which inherit the environment):
# PBKDF2 costs about a second a hash here and was ~80 % of the db suite's time (healthchecks does the same).
os.environ.setdefault("PASSWORD_HASHERS", "django.contrib.auth.hashers.MD5PasswordHasher")


def pytest_configure(config: pytest.Config) -> None:
    # pytest-django has read the settings before this module was imported: name the hasher to them as well.
    from django.conf import settings

    settings.PASSWORD_HASHERS = [name.strip() for name in os.environ["PASSWORD_HASHERS"].split(",") if name.strip()]


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
