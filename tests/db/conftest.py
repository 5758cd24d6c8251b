"""The db suite's shared world: two tenants, each with one member of every role (owner, operator, approver, viewer),
the order assistant with the order-desk tools, and an operator's API key (tests/factories.py ``make_team``).

``world`` is the tenant a test acts in; ``other_world`` a second tenant that must never see it (healthchecks' Alice
and Charlie). A module whose world differs meaningfully keeps its own fixture, named for what differs.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import World, make_team

#: Modules that read, wait on or empty state in Redis (with REDIS_URL: one database for every xdist worker; the
#: throttle tests empty it). Under ``--dist loadgroup`` one worker runs them all, one after another.
SHARED_REDIS = {"test_acceptance", "test_api_throttle", "test_health_workers", "test_key_cache", "test_open_stream_slots",
                "test_periodic_jobs", "test_redis_layer", "test_run_list_resync", "test_skeleton", "test_store",
                "test_trace_socket"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "db" and item.path.stem in SHARED_REDIS:
            item.add_marker(pytest.mark.xdist_group("shared-redis"))


@pytest.fixture
def world(db: Any) -> World:
    return make_team()


@pytest.fixture
def other_world(db: Any) -> World:
    return make_team()
