"""The db suite's shared world: two tenants, each with one member of every role (owner, operator, approver, viewer),
the order assistant with the order-desk tools, and an operator's API key (tests/factories.py ``make_team``).

``world`` is the tenant a test acts in; ``other_world`` a second tenant that must never see it (healthchecks' Alice
and Charlie). A module whose world differs meaningfully keeps its own fixture, named for what differs.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories import World, make_team


@pytest.fixture
def world(db: Any) -> World:
    return make_team()


@pytest.fixture
def other_world(db: Any) -> World:
    return make_team()
