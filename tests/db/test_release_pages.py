"""Issue #16 items 3-4: the release-safety pages (console/release_pages.py) and admins (releases/admin.py).

An operator creates an evaluation set by filter or from picked runs, starts a replay from the set's page, follows its
progress (JSON) and reads the diff page; forms need the CSRF token; bad input is a 400 naming the field; another
tenant's set, batch and results are 404s on every page, the progress JSON and the admin.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from agents import services
from agents.models import AgentVersion, Run
from audit.models import ConfigChange
from marketplace.builtin import order_desk
from releases import services as releases
from releases.models import EvaluationSet, ReplayBatch, ReplayRun
from tenants.scoping import Actor
from tests.factories import World, csrf_client, make_world

pytestmark = pytest.mark.django_db

QUESTIONS = ["Where is my order O202411280001?", "What is in order O202411280002?"]


@pytest.fixture
def world() -> World:
    w = make_world()
    order_desk.REFUNDS.clear()
    for text in QUESTIONS:
        run = services.start_run(actor=Actor(api_key=w.key), agent=w.agent, text=text)
        services.execute_run(str(run.pk))
    return w


def _token(client: Client, url: str = "/console/evaluation-sets/") -> str:
    page = client.get(url)
    assert page.status_code == 200, page.content[:500]
    return page.context["csrf_token"]


def _finish(batch_id: Any) -> ReplayBatch:
    batch = ReplayBatch.objects.get(pk=batch_id)
    for shard in range(batch.concurrency):  # the workers' task, run here (on_commit never fires in a test transaction)
        releases.run_shard(batch.pk, shard, batch.concurrency)
    batch.refresh_from_db()
    return batch


def _create_set(client: Client, world: World, **fields: Any) -> Any:
    data = {"csrfmiddlewaretoken": _token(client), "name": "yesterday", "agent": str(world.agent.pk), "limit": "10", **fields}
    return client.post("/console/evaluation-sets/", data)


def test_create_a_set_by_filter_replay_it_and_read_the_diff_page(world: World) -> None:
    client = csrf_client(world.operator)
    assert client.post("/console/evaluation-sets/", {"name": "x", "agent": str(world.agent.pk)}).status_code == 403  # CSRF
    created = _create_set(client, world, versions="1")
    assert created.status_code == 302, created.content[:2000]
    row = EvaluationSet.objects.get(tenant=world.tenant, name="yesterday")
    assert row.members.count() == 2 and row.filters == {"versions": [1], "limit": 10}
    assert ConfigChange.objects.filter(action="evaluation_set.created", tenant=world.tenant).count() == 1
    listing = client.get("/console/evaluation-sets/").content.decode()
    assert f'data-set-id="{row.pk}"' in listing and "yesterday" in listing

    set_url = f"/console/evaluation-sets/{row.pk}/"
    page = client.get(set_url)
    html = page.content.decode()
    assert page.status_code == 200 and 'id="replay-form"' in html and html.count("<tr><td>") >= 2
    started = client.post(f"{set_url}replays/", {"csrfmiddlewaretoken": page.context["csrf_token"],
                                                 "candidate": str(world.version.pk), "model_mode": "recorded",
                                                 "miss_policy": "stop", "check": ["same_tools", "no_diff"],
                                                 "answer_contains": "O202411280001"})
    assert started.status_code == 302
    batch = ReplayBatch.objects.get(evaluation_set=row)
    assert started["Location"] == f"/console/replays/{batch.pk}/"
    assert batch.checks == [{"check": "same_tools"}, {"check": "no_diff"}, {"check": "answer_contains", "text": "O202411280001"}]
    waiting = client.get(started["Location"]).content.decode()
    assert 'data-running="true"' in waiting and "console/replay.js" in waiting
    assert client.get(f"/console/replays/{batch.pk}/progress.json").json()["status"] == "queued"

    batch = _finish(batch.pk)
    progress = client.get(f"/console/replays/{batch.pk}/progress.json").json()
    assert progress == {**progress, "status": "finished", "done": 2, "total": 2, "passed": 1, "failed": 1, "pass_rate": 0.5}
    diff_page = client.get(f"/console/replays/{batch.pk}/").content.decode()
    assert 'data-running="false"' in diff_page and "pass rate <strong id=\"batch-pass-rate\">50 %</strong>" in diff_page
    sections = re.findall(r'<section class="replay-result[^"]*" data-source-run="([^"]+)" data-passed="(\w+)"', diff_page)
    assert [passed for _, passed in sections] == ["false", "true"], "the failing run is listed first"
    assert "answer_contains: FAILED" in diff_page and "no diff" in diff_page
    assert 'data-field="tools"' in diff_page and "query_order(" in diff_page  # the tool calls side by side


def test_a_changed_version_shows_its_regressions_first_with_the_answer_diff(world: World) -> None:
    lean = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner",
                                       system_prompt=world.version.system_prompt,
                                       tools=[t for t in world.version.tools if t != "query_logistics"])
    client = csrf_client(world.operator)
    assert _create_set(client, world).status_code == 302
    row = EvaluationSet.objects.get(tenant=world.tenant)
    page = client.get(f"/console/evaluation-sets/{row.pk}/")
    started = client.post(f"/console/evaluation-sets/{row.pk}/replays/", {
        "csrfmiddlewaretoken": page.context["csrf_token"], "candidate": str(lean.pk), "model_mode": "live",
        "cost_cap": "1.00", "miss_policy": "stop", "check": ["same_tools"]})
    assert started.status_code == 302, [str(m) for m in started.wsgi_request._messages]
    batch = _finish(ReplayBatch.objects.get(evaluation_set=row).pk)
    html = client.get(f"/console/replays/{batch.pk}/").content.decode()
    first = html.index('<section class="replay-result')
    assert html[first:first + 80].startswith('<section class="replay-result regression"')
    assert 'class="changed"><th>Tool calls ≠' in html and "Answer diff" in html
    assert ReplayRun.objects.filter(batch=batch, regression=True).exists()


def test_pick_runs_by_hand_and_bad_input_is_a_400_naming_the_field(world: World) -> None:
    other = make_world()
    foreign = services.start_run(actor=Actor(api_key=other.key), agent=other.agent, text="hello")
    client = csrf_client(world.operator)
    mine = [str(r.pk) for r in Run.objects.filter(tenant=world.tenant)]
    prefilled = client.get("/console/evaluation-sets/", {"run": mine[0], "agent": world.agent.pk}).content.decode()
    assert mine[0] in prefilled  # the runs list's "make a set of these runs" link lands here with them filled in
    picked = _create_set(client, world, name="picked", runs="\n".join(mine[:1]))
    assert picked.status_code == 302
    assert list(EvaluationSet.objects.get(name="picked").members.values_list("run_id", flat=True)) == [Run.objects.get(pk=mine[0]).pk]

    stolen = _create_set(client, world, name="stolen", runs=str(foreign.pk))
    assert stolen.status_code == 400 and 'data-field="run_ids"' in stolen.content.decode()
    assert str(foreign.pk) in stolen.content.decode()
    nameless = _create_set(client, world, name="")
    assert nameless.status_code == 400 and 'data-field="name"' in nameless.content.decode()
    theirs = _create_set(client, world, name="theirs", agent=str(other.agent.pk))
    assert theirs.status_code == 400 and 'data-field="agent"' in theirs.content.decode()
    bad_date = _create_set(client, world, name="dated", created_after="yesterday")
    assert bad_date.status_code == 400 and "filters.created_after" in bad_date.content.decode()
    assert not EvaluationSet.objects.filter(name__in=["stolen", "", "theirs", "dated"]).exists()

    row = EvaluationSet.objects.get(name="picked")
    token = _token(client, f"/console/evaluation-sets/{row.pk}/")
    bad = client.post(f"/console/evaluation-sets/{row.pk}/replays/", {"csrfmiddlewaretoken": token, "candidate": str(world.version.pk),
                                                                       "model_mode": "live"}, follow=True)
    assert "Replay not started" in bad.content.decode() and "cost_cap" in bad.content.decode()
    wrong = client.post(f"/console/evaluation-sets/{row.pk}/replays/", {"csrfmiddlewaretoken": token,
                                                                         "candidate": str(other.version.pk)}, follow=True)
    assert "candidate" in wrong.content.decode() and not ReplayBatch.objects.exists()


def test_another_tenants_sets_and_replays_are_404s_on_pages_json_and_admin(world: World) -> None:
    from tenants.scoping import actor_for_user

    row = releases.create_evaluation_set(tenant=world.tenant, actor=actor_for_user(world.operator), name="mine",
                                         agent=world.agent, filters={"limit": 10})
    batch = releases.start_replay(tenant=world.tenant, actor=actor_for_user(world.operator), evaluation_set=row,
                                  candidate=world.version, concurrency=1)
    batch = _finish(batch.pk)
    result = ReplayRun.objects.filter(batch=batch).first()
    other = make_world()
    client = csrf_client(other.operator)
    token = _token(client)
    for url in (f"/console/evaluation-sets/{row.pk}/", f"/console/replays/{batch.pk}/",
                f"/console/replays/{batch.pk}/progress.json"):
        assert client.get(url).status_code == 404, url
    assert client.post(f"/console/evaluation-sets/{row.pk}/replays/", {"csrfmiddlewaretoken": token,
                                                                        "candidate": str(world.version.pk)}).status_code == 404
    assert client.post(f"/console/replays/{batch.pk}/cancel/", {"csrfmiddlewaretoken": token}).status_code == 404
    assert "mine" not in client.get("/console/evaluation-sets/").content.decode()
    assert ReplayBatch.objects.count() == 1
    for url in (f"/admin/releases/evaluationset/{row.pk}/change/", f"/admin/releases/replaybatch/{batch.pk}/change/",
                f"/admin/releases/replayrun/{result.pk}/change/"):
        response = client.get(url)
        assert response.status_code in (302, 404), url  # Django's admin answers a foreign object by "doesn't exist"
        if response.status_code == 302:
            assert response["Location"] == "/admin/", url
    # a viewer of the owning tenant sees the pages but not the replay form
    viewer = csrf_client(world.viewer)
    assert 'id="replay-form"' not in viewer.get(f"/console/evaluation-sets/{row.pk}/").content.decode()


def test_the_admin_shows_sets_with_frozen_members_and_read_only_results(world: World) -> None:
    from tenants.scoping import actor_for_user

    row = releases.create_evaluation_set(tenant=world.tenant, actor=actor_for_user(world.operator), name="mine",
                                         agent=world.agent, filters={"limit": 10})
    batch = _finish(releases.start_replay(tenant=world.tenant, actor=actor_for_user(world.operator), evaluation_set=row,
                                          candidate=world.version, concurrency=1).pk)
    result = ReplayRun.objects.filter(batch=batch).first()
    client = csrf_client(world.operator)
    page = client.get(f"/admin/releases/evaluationset/{row.pk}/change/")
    html = page.content.decode()
    assert page.status_code == 200 and "member runs (frozen" in html.lower() and 'name="_save"' not in html
    for run in Run.objects.filter(tenant=world.tenant):
        assert str(run.pk) in html
    assert client.get("/admin/releases/evaluationset/add/").status_code == 403
    listing = client.get("/admin/releases/replaybatch/").content.decode()
    assert f"/admin/releases/replaybatch/{batch.pk}/change/" in listing
    detail = client.get(f"/admin/releases/replayrun/{result.pk}/change/").content.decode()
    assert "same_tools: passed" in detail and 'name="_save"' not in detail
    # the action starts a replay through the service (audited like the API's)
    token = page.context["csrf_token"]
    acted = client.post("/admin/releases/evaluationset/", {"csrfmiddlewaretoken": token, "action": "replay_current_version",
                                                           "_selected_action": [row.pk]}, follow=True)
    assert "queued" in acted.content.decode()
    assert ReplayBatch.objects.filter(evaluation_set=row).count() == 2
    assert ConfigChange.objects.filter(action="replay.started", tenant=world.tenant).count() == 2


def test_a_queued_replay_can_be_cancelled_from_its_page_by_an_operator_only(world: World) -> None:
    from tenants.scoping import actor_for_user

    row = releases.create_evaluation_set(tenant=world.tenant, actor=actor_for_user(world.operator), name="mine",
                                         agent=world.agent, filters={"limit": 10})
    batch = releases.start_replay(tenant=world.tenant, actor=actor_for_user(world.operator), evaluation_set=row,
                                  candidate=world.version, concurrency=1)
    url = f"/console/replays/{batch.pk}/"
    viewer = csrf_client(world.viewer)
    page = viewer.get(url)
    assert 'id="replay-cancel"' not in page.content.decode()
    assert viewer.post(f"{url}cancel/", {"csrfmiddlewaretoken": page.context["csrf_token"]}).status_code in (302, 403)
    batch.refresh_from_db()
    assert batch.status == "queued"
    client = csrf_client(world.operator)
    page = client.get(url)
    assert 'id="replay-cancel"' in page.content.decode()
    assert client.post(f"{url}cancel/").status_code == 403  # CSRF
    done = client.post(f"{url}cancel/", {"csrfmiddlewaretoken": page.context["csrf_token"]}, follow=True)
    batch.refresh_from_db()
    assert batch.status == "cancelled" and "Replay cancelled" in done.content.decode()
    assert ConfigChange.objects.filter(action="replay.cancelled", tenant=world.tenant).count() == 1
    again = client.post(f"{url}cancel/", {"csrfmiddlewaretoken": page.context["csrf_token"]}, follow=True)
    assert "Not cancelled" in again.content.decode() and 'id="replay-cancel"' not in again.content.decode()



def _query_counts(world: World) -> dict[str, list[int]]:
    """Queries per page for a set of 2 runs and one of 5 (each replayed once)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tenants.scoping import actor_for_user

    actor = actor_for_user(world.operator)
    small = releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="small", agent=world.agent,
                                           filters={"limit": 10})
    for text in ("Where is my order O202411280002?", "Hello", "What is in order O202411280001?"):
        run = services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text=text)
        services.execute_run(str(run.pk))
    big = releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="big", agent=world.agent,
                                         filters={"limit": 10})
    assert (small.members.count(), big.members.count()) == (2, 5)
    client = csrf_client(world.operator)
    counts: dict[str, list[int]] = {}
    for row in (small, big):
        batch = _finish(releases.start_replay(tenant=world.tenant, actor=actor, evaluation_set=row,
                                              candidate=world.version, concurrency=1).pk)
        for name, url in (("set", f"/console/evaluation-sets/{row.pk}/"), ("list", "/console/evaluation-sets/"),
                          ("batch", f"/console/replays/{batch.pk}/"), ("progress", f"/console/replays/{batch.pk}/progress.json")):
            with CaptureQueriesContext(connection) as queries:
                assert client.get(url).status_code == 200
            counts.setdefault(name, []).append(len(queries))
    return counts


def test_the_set_pages_queries_do_not_grow_with_the_runs(world: World) -> None:
    counts = _query_counts(world)
    assert all(counts[name][0] == counts[name][1] for name in ("set", "list", "progress")), counts


def test_the_batch_pages_queries_do_not_grow_with_the_runs(world: World) -> None:
    counts = _query_counts(world)
    assert counts["batch"][0] == counts["batch"][1], counts
