"""Issue #14, goal 2: the run reads are lean — they load only what they show, in one indexed query — and issue #51:
a run's body and an event's are each declared once (agents/serializers.py) and every reader sends that body."""

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
from agents.serializers import RunEventSerializer, RunSerializer, event_frames
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
    assert api.get(f"/api/v1/runs/{run.pk}").status_code == 200  # warm: the key
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


def test_the_runs_list_answers_the_run_serializer_s_body_for_each_run(world: World) -> None:
    api = _api(world)
    runs = _runs(world, 3)
    resolver = make_user()
    now = timezone.now()
    Run.objects.filter(pk=runs[0].pk).update(
        status="finished", terminal_reason="final_answer", output="done", usage={"tokens": 12, "cost": "0.01"},
        started_at=now - timedelta(seconds=3), finished_at=now, facts={"injection_flags": ["ignore previous"], "parent_run": "p"},
        attention_reasons=[{"kind": "outcome_unknown", "step": 2}, None], attention_resolved_at=now,
        attention_resolved_by=resolver, attention_resolution="checked")
    page = api.get("/api/v1/runs?limit=10").json()["results"]
    request = APIClient().get("/").wsgi_request
    loaded = Run.objects.select_related("agent", "version", "attention_resolved_by").filter(tenant=world.tenant)
    expected = {str(r.pk): RunSerializer(r, context={"request": request}).data for r in loaded}
    assert {item["id"]: item for item in page} == expected
    (first,) = [item for item in page if item["id"] == str(runs[0].pk)]
    assert first["attention_resolved_by"] == resolver.username and first["injection_flags"] == ["ignore previous"]
    assert first["parent_run"] == "p" and first["finished_at"].endswith("Z")  # DRF's own date rendering, in UTC
    assert api.get(f"/api/v1/runs/{runs[0].pk}").json() == first


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


def test_the_runs_list_pages_answer_what_the_orm_answers(world: World) -> None:
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


def test_the_events_page_answers_the_event_serializer_s_body_as_the_stream_sends_it(world: World) -> None:
    (run,) = _runs(world, 1)
    now = timezone.now()
    for seq in range(1, 6):
        RunEvent.objects.create(tenant=world.tenant, run=run, seq=seq, step=seq // 2, type="tool.called",
                                span_id=f"{seq:016x}", parent_span_id="" if seq == 1 else "0" * 16,
                                payload={"n": seq, "ünï": ["côdé", None]}, at=now + timedelta(microseconds=seq))
    api = _api(world)
    expected = RunEventSerializer(RunEvent.objects.filter(run=run).order_by("seq"), many=True).data
    assert event_frames(RunEvent.objects.filter(run=run).order_by("seq")) == expected  # the stream's, the socket's
    first = api.get(f"/api/v1/runs/{run.pk}/events?after=0&limit=3").json()
    assert first["events"] == expected[:3] and first["has_more"] and first["next_after"] == 3
    rest = api.get(f"/api/v1/runs/{run.pk}/events?after=3&limit=3").json()
    assert rest["events"] == expected[3:] and not rest["has_more"] and rest["next_after"] == 5
    with CaptureQueriesContext(connection) as queries:
        empty = api.get(f"/api/v1/runs/{run.pk}/events?after=5").json()
    assert empty["events"] == [] and empty["next_after"] == 5 and not empty["has_more"]
    assert len([q for q in queries if 'FROM "agents_runevent"' in q["sql"]]) == 1  # an empty page: one read
