"""Issue #51: the hot reads go through the plain ORM (no compiled querysets); each costs a fixed number of statements,
pinned here, whatever the number of runs, events, turns or tools it reads — a query per row (N+1) fails."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from agents import engine
from agents.models import Run, RunEvent, Session, Turn
from tests.factories import World, make_world
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def _runs(world: World, count: int) -> list[Run]:
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    return [Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session,
                               input=f"question {i}") for i in range(count)]


def _events(run: Run, count: int, first: int = 1) -> None:
    RunEvent.objects.bulk_create([RunEvent(tenant=run.tenant, run=run, seq=seq, step=0, type="tool.called",
                                           span_id=f"{seq:016x}", payload={"n": seq}, at=timezone.now())
                                  for seq in range(first, first + count)])


def _statements(queries: CaptureQueriesContext) -> int:
    """Statements past the API key's own row (read from the key cache where there is one: PostgreSQL + Redis mode)."""
    return len([q for q in queries if 'FROM "tenants_apikey"' not in q["sql"]])


def _count(api: APIClient, path: str, status: int = 200) -> int:
    api.get(path)  # warm: the key cache, the first touch of the key
    with CaptureQueriesContext(connection) as queries:
        assert api.get(path).status_code == status
    return _statements(queries)


def test_the_runs_list_costs_the_same_statements_for_one_run_and_for_forty(world: World) -> None:
    api = bearer_client(world.raw_key)
    _runs(world, 1)
    one = _count(api, "/api/v1/runs?limit=200")
    _runs(world, 39)
    forty = _count(api, "/api/v1/runs?limit=200")
    filtered = _count(api, "/api/v1/runs?limit=200&needs_attention=false")
    assert forty == one == filtered == 1, (one, forty, filtered)  # the page


def test_a_run_and_its_events_page_cost_the_same_statements_for_one_event_and_for_forty(world: World) -> None:
    api = bearer_client(world.raw_key)
    (run,) = _runs(world, 1)
    detail = _count(api, f"/api/v1/runs/{run.pk}")
    _events(run, 1)
    one = _count(api, f"/api/v1/runs/{run.pk}/events?limit=100")
    _events(run, 39, first=2)
    forty = _count(api, f"/api/v1/runs/{run.pk}/events?limit=100")
    assert detail == 1  # the run
    assert forty == one == 2, (one, forty)  # the run, then the page of events


def test_a_run_s_start_reads_the_same_statements_for_one_earlier_turn_and_for_thirty(world: World) -> None:
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)

    def run_in_session() -> Run:
        return Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session,
                                  input="where is my order?")

    def reads(turns: int) -> int:
        for n in range(Turn.objects.filter(session=session).count(), turns):
            Turn.objects.create(tenant=world.tenant, session=session, run=run_in_session(), turn_seq=n,
                                user_message=f"q{n}", assistant_message=f"a{n}")
        run = Run.objects.select_related("tenant", "agent", "version", "session").get(pk=run_in_session().pk)
        with CaptureQueriesContext(connection) as queries:
            engine.initial_checkpoint(run, None)
            tools = engine.visible_tools(run)
        assert len(tools) == len(world.version.tools)
        return len(queries)

    one, thirty = reads(1), reads(30)
    assert thirty == one == 2, (one, thirty)  # the session's latest turns, the version's tools


def test_a_run_creation_costs_a_fixed_number_of_statements(world: World) -> None:
    api = bearer_client(world.raw_key)
    body = {"agent": world.agent.slug, "input": "where is my order?"}
    assert api.post("/api/v1/runs", body, format="json").status_code == 202
    with CaptureQueriesContext(connection) as queries:
        answer: Any = api.post("/api/v1/runs", body, format="json")
    assert answer.status_code == 202
    # the acting tenant, the agent with its tenant and version, the release reads (preset, weights), then the
    # session's and the run's rows: in one statement on PostgreSQL (core/batch.py) in a savepoint, three on SQLite
    expected = 7 if connection.vendor == "postgresql" else 8
    assert _statements(queries) == expected, [q["sql"][:120] for q in queries]
