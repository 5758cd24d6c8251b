"""Issue #14, goal 2: the run reads are lean — they load only what they show, in one indexed query, and write their
bodies out by hand — and answer exactly what DRF's generic serializers answered."""

from __future__ import annotations

import datetime
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from agents.api import NewestFirst
from agents.models import Run, RunEvent, Session
from agents.serializers import RUN_READ_FIELDS, RunEventSerializer, RunSerializer
from tests.factories import World, make_user, make_world
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db


def _api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _runs(world: World, count: int) -> list[Run]:
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    return [Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session,
                               input=f"question {i}", state={"messages": [{"role": "user", "content": "x" * 1000}]})
            for i in range(count)]


def test_a_run_s_body_is_the_one_drf_s_serializer_wrote(world: World) -> None:
    run, plain = _runs(world, 2)
    resolver = make_user()
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        status="finished", terminal_reason="final_answer", output="done", usage={"tokens": 12, "cost": "0.01"},
        started_at=now - timedelta(seconds=3), finished_at=now, facts={"injection_flags": ["ignore previous"], "a": 1},
        needs_attention=False, attention_reasons=[{"kind": "outcome_unknown", "step": 2}, None],
        attention_resolved_at=now, attention_resolved_by=resolver, attention_resolution="checked")
    request = APIClient().get("/").wsgi_request
    for pk in (run.pk, plain.pk):
        loaded = Run.objects.select_related("agent", "version", "attention_resolved_by").only(*RUN_READ_FIELDS).get(pk=pk)
        serializer = RunSerializer(context={"request": request})
        assert serializer.to_representation(loaded) == serializer.generic_representation(loaded)


def test_an_event_s_body_is_the_one_drf_s_serializer_wrote(world: World) -> None:
    (run,) = _runs(world, 1)
    event = RunEvent.objects.create(tenant=world.tenant, run=run, seq=1, step=0, type="run.started", span_id="a" * 16,
                                    payload={"x": [1, 2], "ünï": "côdé"}, at=timezone.now())
    serializer = RunEventSerializer()
    assert serializer.to_representation(event) == serializer.generic_representation(event)


def test_the_run_list_reads_one_page_in_one_query_without_the_runs_state(world: World) -> None:
    api = _api(world)
    _runs(world, 3)
    assert api.get("/api/v1/runs").status_code == 200  # warm: the key is looked up and touched
    with CaptureQueriesContext(connection) as few:
        assert len(api.get("/api/v1/runs?limit=200").json()["results"]) == 3
    _runs(world, 12)
    with CaptureQueriesContext(connection) as many:
        page = api.get("/api/v1/runs?limit=200").json()
    assert len(page["results"]) == 15
    assert len(many) == len(few)  # no query per run
    reads = [q["sql"] for q in many if 'FROM "agents_run"' in q["sql"]]
    assert len(reads) == 1 and '"agents_run"."state"' not in reads[0] and '"agents_run"."pending_calls"' not in reads[0]
    # the page is in the order of the (tenant, -created_at) index
    times = [r["created_at"] for r in page["results"]]
    assert times == sorted(times, reverse=True)


def test_a_run_and_its_events_page_do_not_load_the_run_s_state(world: World) -> None:
    api = _api(world)
    (run,) = _runs(world, 1)
    assert api.get(f"/api/v1/runs/{run.pk}").status_code == 200
    for path in (f"/api/v1/runs/{run.pk}", f"/api/v1/runs/{run.pk}/events?after=0"):
        with CaptureQueriesContext(connection) as queries:
            assert api.get(path).status_code == 200
        reads = [q["sql"] for q in queries if 'FROM "agents_run"' in q["sql"]]
        assert len(reads) == 1 and '"agents_run"."state"' not in reads[0], reads


def test_pages_of_runs_stop_at_200() -> None:
    assert NewestFirst.max_page_size == 200


def test_an_action_that_changes_a_run_still_loads_all_of_it(world: World) -> None:
    api = _api(world)
    (run,) = _runs(world, 1)
    cancelled: Any = api.post(f"/api/v1/runs/{run.pk}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["id"] == str(run.pk)


def test_a_run_creation_reads_the_agents_tenant_and_current_version_with_the_agent(world: World) -> None:
    api = _api(world)
    body = {"agent": world.agent.slug, "input": "where is my order?"}
    assert api.post("/api/v1/runs", body, format="json").status_code == 202
    with CaptureQueriesContext(connection) as queries:
        assert api.post("/api/v1/runs", body, format="json").status_code == 202
    # no lazy read of the version or the tenant by id after the agent's: the join brought them (one query fewer
    # each); the acting tenant is read once, fresh (tenants.scoping.single_tenant), not from the key cache
    def by_id(table: str) -> list[str]:
        return [q["sql"] for q in queries if q["sql"].startswith("SELECT") and f'FROM "{table}" WHERE "{table}"."id" =' in q["sql"]]

    assert by_id("agents_agentversion") == []
    assert len(by_id("tenants_tenant")) == 1


def test_one_run_is_read_in_one_query_and_a_foreign_or_malformed_id_is_a_404(world: World) -> None:
    import uuid

    from django.contrib.auth import get_user_model

    api = _api(world)
    (run,) = _runs(world, 1)
    other = make_world()
    (foreign,) = _runs(other, 1)
    assert api.get(f"/api/v1/runs/{run.pk}").status_code == 200  # warm: the key, the compiled read
    with CaptureQueriesContext(connection) as queries:
        body = api.get(f"/api/v1/runs/{run.pk}").json()
    assert body["id"] == str(run.pk) and body["agent"] == world.agent.slug
    reads = [q["sql"] for q in queries if 'FROM "agents_run"' in q["sql"]]
    assert len(reads) == 1 and '"agents_run"."state"' not in reads[0]
    for pk in (foreign.pk, uuid.uuid4(), "not-a-run-id"):
        for tail in ("", "/events"):
            answer = api.get(f"/api/v1/runs/{pk}{tail}")
            assert answer.status_code == 404, (pk, tail, answer.content)
    assert api.get(f"/api/v1/runs/{run.pk}/events").status_code == 200
    # an operator of the other tenant sees its own run and not the first tenant's; a superuser sees both
    theirs = APIClient()
    theirs.credentials(HTTP_AUTHORIZATION=f"Bearer {other.raw_key}")
    assert theirs.get(f"/api/v1/runs/{foreign.pk}").status_code == 200
    assert theirs.get(f"/api/v1/runs/{run.pk}").status_code == 404
    root = APIClient()
    root.force_authenticate(get_user_model().objects.create_superuser("root-lean", password="correct-horse-battery"))
    assert {root.get(f"/api/v1/runs/{pk}").status_code for pk in (run.pk, foreign.pk)} == {200}


def test_a_page_of_runs_read_as_rows_answers_what_orm_instances_answer(world: World) -> None:
    from agents.api import _RunsPage

    api = _api(world)
    runs = _runs(world, 3)
    resolver = make_user()
    Run.objects.filter(pk=runs[0].pk).update(attention_resolved_by=resolver, attention_resolved_at=timezone.now(),
                                             usage={"tokens": 5}, facts={"k": ["ü"]})
    page = api.get("/api/v1/runs?limit=10").json()["results"]
    request = APIClient().get("/").wsgi_request
    serializer = RunSerializer(context={"request": request})
    loaded = Run.objects.select_related("agent", "version", "attention_resolved_by").only(*RUN_READ_FIELDS)
    expected = {str(r.pk): serializer.generic_representation(r) for r in loaded.filter(tenant=world.tenant)}
    assert {item["id"]: item for item in page} == expected
    # the page is read as row dicts (no model instances): each column the value the ORM's instance holds
    rows = _RunsPage([world.tenant.pk], (), ()).order_by("-created_at")[0:10]
    if connection.vendor != "postgresql":  # not compiled (SQLite): the ORM's instances
        assert [r.pk for r in rows] == [r.pk for r in loaded.filter(tenant=world.tenant).order_by("-created_at")]
        return
    assert all(isinstance(row, dict) for row in rows) and len(rows) == 3
    for row in rows:
        orm = loaded.get(pk=row["id"])
        assert set(row) >= {"id", "tenant_id", "created_at", "facts", "agent__slug", "version__number",
                            "attention_resolved_by__username"}
        for name, value in row.items():
            relation, _, field = name.partition("__")
            related = getattr(orm, relation)
            expected_value = (getattr(related, field) if related is not None else None) if field else getattr(orm, name)
            assert value == expected_value, name
    (row,) = [r for r in rows if r["id"] == runs[0].pk]
    assert row["attention_resolved_by__username"] == resolver.username and row["agent__slug"] == world.agent.slug
    assert serializer.to_representation(row) == serializer.generic_representation(loaded.get(pk=runs[0].pk))


def _walk(api: APIClient, path: str) -> tuple[list[str], list[str]]:
    """Every run id of a list, following next links to the end, then previous links back to the start."""
    forward: list[str] = []
    page = api.get(path).json()
    forward += [r["id"] for r in page["results"]]
    pages = [page]
    while page["next"]:
        page = api.get(page["next"]).json()
        forward += [r["id"] for r in page["results"]]
        pages.append(page)
    backward: list[str] = []
    while page["previous"]:
        page = api.get(page["previous"]).json()
        backward = [r["id"] for r in page["results"]] + backward
    return forward, backward + [r["id"] for r in pages[-1]["results"]]


def test_the_runs_list_pages_read_by_compiled_queries_answer_what_the_orm_answers(world: World) -> None:
    from agents.api import _runs_page

    api = _api(world)
    runs = _runs(world, 9)
    other = make_world("other-tenant")
    _runs(other, 4)  # never on the first tenant's pages
    base = timezone.now().replace(microsecond=0)
    for i, run in enumerate(runs):
        Run.objects.filter(pk=run.pk).update(created_at=base - timedelta(seconds=i), needs_attention=i % 2 == 0)
    ordered = [str(r.pk) for r in Run.objects.filter(tenant=world.tenant).order_by("-created_at", "-pk")]
    flagged = {str(r.pk) for r in runs[::2]}

    forward, backward = _walk(api, "/api/v1/runs?limit=2")
    assert forward == ordered  # newest first, each once
    assert backward == forward  # back from the last page through the previous links: the same runs, same order
    only_flagged, _ = _walk(api, "/api/v1/runs?limit=2&needs_attention=true")
    assert only_flagged == [pk for pk in ordered if pk in flagged]
    not_flagged, _ = _walk(api, "/api/v1/runs?limit=4&needs_attention=false")
    assert not_flagged == [pk for pk in ordered if pk not in flagged]

    # each page is one read of the runs table, also with a cursor and a filter
    second = api.get("/api/v1/runs?limit=2").json()["next"]
    with CaptureQueriesContext(connection) as queries:
        assert api.get(second + "&needs_attention=true").status_code == 200
    assert len([q for q in queries if 'FROM "agents_run"' in q["sql"]]) == 1
    if connection.vendor == "postgresql":  # compiled once per shape, then only bound: no new shape for a new cursor
        hits = _runs_page.cache_info().hits
        assert api.get(second).status_code == 200
        assert _runs_page.cache_info().hits == hits + 1

    # the other tenant's key sees its own four and none of these; a bad filter or cursor is a 400 naming it
    assert {r["id"] for r in _api(other).get("/api/v1/runs?limit=200").json()["results"]}.isdisjoint(ordered)
    assert len(_api(other).get("/api/v1/runs?limit=200").json()["results"]) == 4
    bad = api.get("/api/v1/runs?needs_attention=maybe")
    assert bad.status_code == 400 and "needs_attention" in bad.text, bad.json()
    assert api.get("/api/v1/runs?cursor=bm9wZQ").status_code == 400


@pytest.mark.filterwarnings("ignore:DateTimeField Run.created_at received a naive datetime")
def test_a_forged_cursor_with_a_naive_time_reads_that_time_in_utc(world: World) -> None:
    import base64
    from urllib.parse import urlencode

    api = _api(world)
    (old, new) = _runs(world, 2)
    cut = timezone.now().replace(microsecond=0) - timedelta(hours=1)
    Run.objects.filter(pk=old.pk).update(created_at=cut - timedelta(minutes=1))
    Run.objects.filter(pk=new.pk).update(created_at=cut + timedelta(minutes=1))
    position = cut.astimezone(datetime.UTC).replace(tzinfo=None).isoformat(" ")
    cursor = base64.b64encode(urlencode({"p": position}).encode()).decode()
    page = api.get("/api/v1/runs?" + urlencode({"cursor": cursor})).json()
    assert [r["id"] for r in page["results"]] == [str(old.pk)]


def test_the_events_page_read_as_rows_answers_what_drf_wrote_for_the_orm_s_events(world: World) -> None:
    (run,) = _runs(world, 1)
    now = timezone.now()
    for seq in range(1, 6):
        RunEvent.objects.create(tenant=world.tenant, run=run, seq=seq, step=seq // 2, type="tool.called",
                                span_id=f"{seq:016x}", parent_span_id="" if seq == 1 else "0" * 16,
                                payload={"n": seq, "ünï": ["côdé", None]}, at=now + timedelta(microseconds=seq))
    api = _api(world)
    serializer = RunEventSerializer()
    expected = [serializer.generic_representation(e) for e in RunEvent.objects.filter(run=run).order_by("seq")]
    first = api.get(f"/api/v1/runs/{run.pk}/events?after=0&limit=3").json()
    assert first["events"] == expected[:3] and first["has_more"] and first["next_after"] == 3
    rest = api.get(f"/api/v1/runs/{run.pk}/events?after=3&limit=3").json()
    assert rest["events"] == expected[3:] and not rest["has_more"] and rest["next_after"] == 5
    with CaptureQueriesContext(connection) as queries:
        empty = api.get(f"/api/v1/runs/{run.pk}/events?after=5").json()
    assert empty["events"] == [] and empty["next_after"] == 5 and not empty["has_more"]
    assert len([q for q in queries if 'FROM "agents_runevent"' in q["sql"]]) == 1  # an empty page: one read
    from agents.api import _events_after

    rows = _events_after(3).dicts(run.pk, 0)  # the rows path the pages above took (on PostgreSQL; SQLite: instances)
    assert (rows is not None) == (connection.vendor == "postgresql")
    if rows is not None:
        assert [serializer.to_representation(row) for row in rows] == expected[:4]
