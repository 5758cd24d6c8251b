"""Issue #14: lists asked for without filter parameters skip django-filter (core/filters.py). Attacked with a second
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


def test_the_runs_list_without_filter_parameters_builds_no_filterset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs list is filtered by core/filters.py ``ListFilterBackend``; without any of
    RunFilter's parameters it skips the filterset too, and with one it still filters and still refuses a bad value."""
    import django_filters

    world = make_world()
    run, child = make_run(world), make_run(world)
    child.playground = True
    child.save(update_fields=["playground"])
    client = bearer_client(world.raw_key)
    built: list[str] = []
    real_init = django_filters.FilterSet.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(type(self).__name__)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(django_filters.FilterSet, "__init__", counted)
    listed = client.get("/api/v1/runs?limit=50").json()["results"]
    assert {r["id"] for r in listed} == {str(run.pk), str(child.pk)}
    assert built == []
    narrowed = client.get("/api/v1/runs?playground=true").json()["results"]
    assert [r["id"] for r in narrowed] == [str(child.pk)] and built
    refused = client.get("/api/v1/runs?playground=perhaps")
    assert refused.status_code == 400 and "Must be true or false; got 'perhaps'." in refused.content.decode()
