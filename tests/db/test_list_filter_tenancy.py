"""Issue #14: lists asked for without filter parameters skip django-filter (config/filters.py). Attacked with a second
tenant's key: with and without parameters, a list holds only the key's tenant's rows."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.builders import make_run
from tests.factories import make_world
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db

LISTS = ["/api/v1/runs", "/api/v1/sessions", "/api/v1/approvals", "/api/v1/audit/tool-calls", "/api/v1/audit/changes"]


@pytest.mark.parametrize("query", ["", "?limit=50", "?playground=false", "?playground=", "?since=2000-01-01"])
def test_a_second_tenants_lists_hold_none_of_the_firsts_rows(query: str) -> None:
    mine, theirs = make_world(), make_world()
    run = make_run(mine)
    own = make_run(theirs)
    client = bearer_client(theirs.raw_key)
    for path in LISTS:
        response = client.get(path + query)
        assert response.status_code == 200, (path, query, response.content)
        body: Any = response.json()
        text = str(body)
        assert str(run.pk) not in text and str(run.session_id) not in text, (path, query)
        assert mine.tenant.slug not in text, (path, query)
    listed = [r["id"] for r in client.get("/api/v1/runs" + query).json()["results"]]
    assert listed == [str(own.pk)]
    assert [r["id"] for r in bearer_client(mine.raw_key).get("/api/v1/runs" + query).json()["results"]] == [str(run.pk)]
