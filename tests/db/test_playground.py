"""The console's playground, in process: who may use it, version override validation, tenancy, CSRF, the label
and spend apart (the browser side is tests/e2e/test_playground_browser.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from prometheus_client import REGISTRY

from agents import metrics, services
from agents.models import AgentVersion, Run, RunEvent
from console import queries
from tenants.scoping import actor_for_user
from tests.e2e.builders import make_run
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db

START = "/console/playground/runs/"


@pytest.fixture
def worlds() -> tuple[World, World]:
    return make_world(), make_world()


def _client(user: Any, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    assert client.login(username=user.username, password="correct-horse-battery")
    return client


def _version(world: World, number: int = 2) -> AgentVersion:
    return AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=number, model="demo/planner",
                                       tools=world.version.tools, policy=world.version.policy, note="candidate")


def test_the_page_lists_the_tenants_agents_with_every_version_not_only_the_released_one(worlds: Any) -> None:
    world, other = worlds
    v2 = _version(world)
    page = _client(world.operator).get("/console/playground/")
    assert page.status_code == 200
    text = page.content.decode()
    assert f'"id": {v2.pk}' in text and f'"id": {world.version.pk}' in text and "(current)" in text
    assert other.tenant.slug not in text  # another tenant's agents are not offered
    assert 'href="/console/playground/"' in text  # the nav link for a role that starts runs


def test_a_playground_run_runs_the_chosen_version_and_is_labelled(worlds: Any) -> None:
    world, _ = worlds
    v2 = _version(world)
    response = _client(world.operator).post(START, {"agent": world.agent.pk, "version": v2.pk, "input": "where is order O1?"})
    assert response.status_code == 201, response.content
    body = response.json()
    run = Run.objects.get(pk=body["id"])
    assert run.version_id == v2.pk and run.version_id != world.agent.current_version_id
    assert run.playground is True and run.created_by_id == world.operator.pk
    assert body["stream"] == f"/api/v1/runs/{run.pk}/stream" and body["trace"] == f"/console/runs/{run.pk}/"
    # visible as such in the console run list, the API (and filterable there) and the admin
    listing = _client(world.operator).get("/console/runs/").content.decode()
    assert 'class="badge playground"' in listing
    api = Client(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    assert api.get(f"/api/v1/runs/{run.pk}").json()["playground"] is True
    assert [r["id"] for r in api.get("/api/v1/runs?playground=true").json()["results"]] == [str(run.pk)]
    assert str(run.pk) not in {r["id"] for r in api.get("/api/v1/runs?playground=false").json()["results"]}
    bad = api.get("/api/v1/runs?playground=maybe")
    assert bad.status_code == 400 and "playground" in bad.json()
    admin = _client(world.operator).get("/admin/agents/run/?playground__exact=1")
    assert admin.status_code == 200 and str(run.pk) in admin.content.decode()


def test_an_api_run_is_not_a_playground_run(worlds: Any) -> None:
    world, _ = worlds
    api = Client(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    response = api.post("/api/v1/runs", {"agent": world.agent.slug, "input": "hello"}, content_type="application/json")
    assert response.status_code == 202 and response.json()["playground"] is False


def test_a_version_of_another_agent_or_tenant_is_not_found(worlds: Any) -> None:
    world, other = worlds
    client = _client(world.operator)
    foreign_version = client.post(START, {"agent": world.agent.pk, "version": other.version.pk, "input": "hi"})
    foreign_agent = client.post(START, {"agent": other.agent.pk, "version": other.version.pk, "input": "hi"})
    assert foreign_version.status_code == 404 and foreign_agent.status_code == 404
    assert not Run.objects.exists()


def test_the_service_refuses_a_version_that_is_not_the_agents(worlds: Any) -> None:
    world, other = worlds
    actor = actor_for_user(world.operator)
    with pytest.raises(services.RunRefused) as refused:
        services.start_run(actor=actor, agent=world.agent, text="hi", version=other.version, playground=True)
    assert refused.value.field == "version" and "not a version of the agent" in str(refused.value)
    assert not Run.objects.exists()


@pytest.mark.parametrize("form, field", [
    ({"version": "1", "input": "hi"}, "agent"),
    ({"agent": "x", "version": "1", "input": "hi"}, "agent"),
    ({"agent": "AGENT", "input": "hi"}, "version"),
    ({"agent": "AGENT", "version": "VERSION", "input": "   "}, "input"),
    ({"agent": "AGENT", "version": "VERSION", "input": "x" * 20_001}, "input"),
])
def test_bad_input_is_a_400_naming_the_field(worlds: Any, form: dict[str, str], field: str) -> None:
    world, _ = worlds
    form = {k: v.replace("AGENT", str(world.agent.pk)).replace("VERSION", str(world.version.pk)) for k, v in form.items()}
    response = _client(world.operator).post(START, form)
    assert response.status_code == 400 and response.json()["field"] == field and response.json()["error"]


def test_viewers_see_no_playground_and_cannot_start_runs(worlds: Any) -> None:
    world, _ = worlds
    client = _client(world.viewer)
    assert client.get("/console/playground/").status_code == 403
    assert client.post(START, {"agent": world.agent.pk, "version": world.version.pk, "input": "hi"}).status_code == 403
    assert 'href="/console/playground/"' not in client.get("/console/runs/").content.decode()
    assert not Run.objects.exists()


def test_anonymous_visitors_are_sent_to_the_login_page(worlds: Any) -> None:
    world, _ = worlds
    assert Client().get("/console/playground/").status_code == 302
    assert Client().post(START, {"agent": world.agent.pk}).status_code == 302
    assert not Run.objects.exists()


def test_starting_a_run_needs_the_csrf_token(worlds: Any) -> None:
    world, _ = worlds
    client = _client(world.operator, csrf=True)
    form = {"agent": world.agent.pk, "version": world.version.pk, "input": "hi"}
    assert client.post(START, form).status_code == 403
    assert not Run.objects.exists()
    page = client.get("/console/playground/")
    token = page.cookies["csrftoken"].value
    assert client.post(START, form, HTTP_X_CSRFTOKEN=token).status_code == 201


def test_spend_counts_playground_runs_apart(worlds: Any) -> None:
    world, _ = worlds
    make_run(world, usage={"input_tokens": 100, "output_tokens": 10, "cost": 1.0})
    play = make_run(world, usage={"input_tokens": 50, "output_tokens": 5, "cost": 0.25})
    Run.objects.filter(pk=play.pk).update(playground=True)
    report = queries.spend_for(actor_for_user(world.operator), days=7)
    assert (report.total.runs, report.total.cost) == (1, 1.0)
    assert sum(a["totals"].runs for a in report.by_agent) == 1
    assert str(play.pk) not in {r["id"] for r in report.top_runs}
    assert (report.playground.runs, report.playground.cost, report.playground.tokens) == (1, 0.25, 55)
    assert [v["totals"].runs for v in report.playground_by_version] == [1]
    page = _client(world.operator).get("/console/spend/").content.decode()
    assert 'id="playground-spend"' in page and "0.2500" in page


def test_metrics_keep_playground_runs_out_of_the_business_series(worlds: Any) -> None:
    world, _ = worlds
    run = make_run(world)
    rows = list(RunEvent.objects.filter(run=run).order_by("seq"))
    observed = metrics.samples("order-assistant", 3, rows)
    assert any(obs[0] is metrics.RUNS for obs in observed) and any(obs[0] is metrics.LLM_COST for obs in observed)
    run.playground = True
    kept = metrics.without_playground(run, observed)
    assert not any(obs[0] in (metrics.RUNS, metrics.LLM_COST, metrics.LLM_TOKENS, metrics.RUN_STEPS) for obs in kept)
    assert [obs[:2] for obs in kept if obs[0] is metrics.PLAYGROUND_RUNS] == [(metrics.PLAYGROUND_RUNS, {"status": "final_answer"})]
    assert any(obs[0] is metrics.TOOL_CALLS for obs in kept)  # tool behaviour is still observed
    before = REGISTRY.get_sample_value("agentops_playground_runs_total", {"status": "final_answer"}) or 0.0
    metrics._apply(kept)
    assert REGISTRY.get_sample_value("agentops_playground_runs_total", {"status": "final_answer"}) == before + 1
