"""The console's pages, in process: login, tenancy (404 for a foreign run), filters, spend, CSP, escaping, metrics."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from agents import metrics
from agents.models import RunEvent, RunStatus
from agents.store import publish_after_commit, run_summary
from tests.e2e.builders import SCRIPT_OUTPUT, make_run
from tests.factories import World, make_user, make_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def worlds() -> tuple[World, World]:
    return make_world(), make_world()


def _login(client: Any, world: World) -> None:
    assert client.login(username=world.operator.username, password="correct-horse-battery")


# --- authentication -------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/console/", "/console/runs/", "/console/spend/"])
def test_anonymous_visitors_are_sent_to_the_login_page(client: Any, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith(f"/accounts/login/?next={path}")


def test_anonymous_visitors_get_no_trace(client: Any, worlds: Any) -> None:
    run = make_run(worlds[0])
    response = client.get(f"/console/runs/{run.pk}/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert client.get(f"/console/runs/{run.pk}/tool-calls.json").status_code == 302


def test_the_login_page_has_a_csrf_token_and_logs_an_operator_in(client: Any, worlds: Any) -> None:
    world, _ = worlds
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    assert b'name="csrfmiddlewaretoken"' in page.content
    assert "script-src 'self'" in page["Content-Security-Policy"]
    wrong = client.post("/accounts/login/", {"username": world.operator.username, "password": "nope"})
    assert wrong.status_code == 200 and b"did not match" in wrong.content
    response = client.post("/accounts/login/", {"username": world.operator.username, "password": "correct-horse-battery"})
    assert response.status_code == 302 and response["Location"] == "/console/runs/"
    assert client.get("/console/runs/").status_code == 200


def test_the_login_form_is_refused_without_its_csrf_token(worlds: Any) -> None:
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    response = strict.post("/accounts/login/", {"username": worlds[0].operator.username, "password": "correct-horse-battery"})
    assert response.status_code == 403


def test_logout_is_a_post_from_the_nav(client: Any, worlds: Any) -> None:
    _login(client, worlds[0])
    page = client.get("/console/runs/").content.decode()
    assert 'action="/accounts/logout/"' in page and 'href="/console/spend/"' in page and 'href="/admin/"' in page
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/console/runs/").status_code == 302


# --- run list ---------------------------------------------------------------------------

def test_the_run_list_shows_only_the_tenants_runs_newest_first(client: Any, worlds: Any) -> None:
    mine, theirs = worlds
    older = make_run(mine, created_at=timezone.now() - dt.timedelta(hours=1))
    newer = make_run(mine, usage={"input_tokens": 1000, "output_tokens": 234, "cost": 0.5})
    foreign = make_run(theirs)
    _login(client, mine)
    response = client.get("/console/runs/")
    body = response.content.decode()
    assert response.status_code == 200
    ids = re.findall(r'data-run-id="([0-9a-f-]+)"', body)
    assert ids == [str(newer.pk), str(older.pk)]
    assert str(foreign.pk) not in body
    assert "1,234" in body and "0.5000" in body and "2.0 s" in body
    assert "default-src 'self'" in response["Content-Security-Policy"].split("; ")


def test_the_run_list_filters_on_the_server(client: Any, worlds: Any) -> None:
    world, _ = worlds
    other_user = make_user()
    done = make_run(world)
    failed = make_run(world, reason="budget_exceeded")
    running = make_run(world, status=RunStatus.RUNNING, user=other_user)
    _login(client, world)

    def ids(query: str) -> set[str]:
        return set(re.findall(r'data-run-id="([0-9a-f-]+)"', client.get(f"/console/runs/?{query}").content.decode()))

    assert ids("status=running") == {str(running.pk)}
    assert ids("reason=budget_exceeded") == {str(failed.pk)}
    assert ids(f"user={other_user.pk}") == {str(running.pk)}
    assert ids(f"agent={world.agent.pk}") == {str(done.pk), str(failed.pk), str(running.pk)}
    assert ids(f"version={world.version.pk}&status=finished") == {str(done.pk), str(failed.pk)}
    assert ids(f"day={timezone.now():%Y-%m-%d}") == {str(done.pk), str(failed.pk), str(running.pk)}
    assert ids("day=2001-01-01") == set()
    bad = client.get("/console/runs/?status=exploded&agent=x").content.decode()
    assert "status must be one of" in bad and "agent must be a number" in bad


def test_the_run_list_is_paginated(client: Any, worlds: Any) -> None:
    world, _ = worlds
    for _ in range(53):
        make_run(world, with_events=False)
    _login(client, world)
    first = client.get("/console/runs/").content.decode()
    second = client.get("/console/runs/?page=2").content.decode()
    assert len(re.findall(r"data-run-id=", first)) == 50
    assert len(re.findall(r"data-run-id=", second)) == 3
    assert "Page 1 of 2" in first and 'rel="next"' in first
    assert 'data-live="false"' in second  # only the first page takes new runs live


# --- trace ------------------------------------------------------------------------------

def test_a_foreign_or_unknown_run_is_a_404(client: Any, worlds: Any) -> None:
    mine, theirs = worlds
    foreign = make_run(theirs)
    _login(client, mine)
    assert client.get(f"/console/runs/{foreign.pk}/").status_code == 404
    assert client.get(f"/console/runs/{foreign.pk}/tool-calls.json").status_code == 404
    assert client.get("/console/runs/00000000-0000-0000-0000-000000000000/").status_code == 404
    assert client.get("/console/runs/not-a-uuid/").status_code == 404


def test_the_trace_page_carries_the_backlog_as_data_and_no_inline_script(client: Any, worlds: Any) -> None:
    world, _ = worlds
    run = make_run(world, content=SCRIPT_OUTPUT)
    _login(client, world)
    response = client.get(f"/console/runs/{run.pk}/")
    body = response.content.decode()
    assert response.status_code == 200
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "connect-src 'self'" in policy.split("; ")  # 'self' covers the page's own websocket; no socket to any other host
    # every script is either a static file or inert JSON data
    for tag in re.findall(r"<script[^>]*>", body):
        assert 'src="/static/console/' in tag or 'type="application/json"' in tag, tag
    assert "<script>window.__pwned" not in body  # escaped in the output block and in the JSON backlog
    assert "&lt;script&gt;window.__pwned" in body
    assert f'data-ws-path="/ws/runs/{run.pk}/"' in body
    assert body.count('"seq":') == RunEvent.objects.filter(run=run).count()


def test_tool_call_arguments_come_masked_from_the_audit_rows(client: Any, worlds: Any) -> None:
    from audit.models import ToolCallAudit

    world, _ = worlds
    run = make_run(world)
    span = RunEvent.objects.get(run=run, type="tool.call").span_id
    ToolCallAudit.objects.create(tenant=world.tenant, run=run, call_id="c1", span_id=span, tool_name="order_desk.query_order",
                                 arguments_summary='{"order_no": "O1", "password": "******"}', status="ok", latency_ms=7)
    _login(client, world)
    body = client.get(f"/console/runs/{run.pk}/tool-calls.json").json()
    assert body["tool_calls"][span]["arguments_summary"] == '{"order_no": "O1", "password": "******"}'


# --- spend ------------------------------------------------------------------------------

def test_spend_adds_up_by_agent_version_and_day_and_links_down(client: Any, worlds: Any) -> None:
    mine, theirs = worlds
    today = timezone.now()
    yesterday = today - dt.timedelta(days=1)
    costly = make_run(mine, usage={"input_tokens": 1000, "output_tokens": 500, "cost": 2.5})
    make_run(mine, usage={"input_tokens": 10, "output_tokens": 5, "cost": 0.25}, created_at=yesterday)
    make_run(mine, usage={}, created_at=today - dt.timedelta(days=60))  # outside the window
    make_run(theirs, usage={"input_tokens": 99999, "output_tokens": 1, "cost": 99.0})
    _login(client, mine)
    response = client.get("/console/spend/?days=30")
    body = response.content.decode()
    report = response.context["spend"]
    assert report.total.runs == 2
    assert report.total.input_tokens == 1010 and report.total.output_tokens == 505
    assert report.total.cost == pytest.approx(2.75)
    assert [a["id"] for a in report.by_agent] == [mine.agent.pk]
    assert [v["id"] for v in report.by_version] == [mine.version.pk]
    per_day = {d["day"]: d["totals"].cost for d in report.by_day if d["totals"].runs}
    assert per_day == {today.date(): pytest.approx(2.5), yesterday.date(): pytest.approx(0.25)}
    assert report.top_runs[0]["id"] == str(costly.pk)
    assert "99.0000" not in body and "100,000" not in body
    assert f'href="/console/runs/?agent={mine.agent.pk}&amp;since=' in body
    assert f'href="/console/runs/?version={mine.version.pk}&amp;since=' in body
    assert f'href="/console/runs/{costly.pk}/"' in body
    assert f'href="/console/runs/?day={today:%Y-%m-%d}"' in body
    assert "<svg" in body and body.count('<rect class="col"') == 30
    assert "script-src 'self'" in response["Content-Security-Policy"]


def test_spend_charts_tokens_when_nothing_was_priced(client: Any, worlds: Any) -> None:
    world, _ = worlds
    make_run(world, usage={"input_tokens": 10, "output_tokens": 5, "cost": 0})
    _login(client, world)
    response = client.get("/console/spend/?days=7")
    assert response.context["spend"].chart["metric"] == "tokens"
    assert response.context["spend"].days == 7


# --- metrics ------------------------------------------------------------------------------

def _value(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_committed_events_move_the_metrics_once_on_commit(worlds: Any, django_capture_on_commit_callbacks: Any) -> None:
    world, _ = worlds
    run = make_run(world)
    run.agent = world.agent
    rows = list(RunEvent.objects.filter(run=run).order_by("seq"))
    labels = {"agent": world.agent.slug, "status": "final_answer"}
    before = {
        "runs": _value("agentops_runs_total", labels),
        "steps": _value("agentops_run_steps_count"),
        "in": _value("agentops_llm_tokens_total", {"model": "demo/planner", "type": "input"}),
        "out": _value("agentops_llm_tokens_total", {"model": "demo/planner", "type": "output"}),
        "cost": _value("agentops_llm_cost_total", {"model": "demo/planner"}),
        "llm": _value("agentops_llm_request_duration_seconds_count", {"model": "demo/planner"}),
        "tool": _value("agentops_tool_calls_total", {"tool": "order_desk.query_order", "outcome": "ok"}),
        "tool_s": _value("agentops_tool_call_duration_seconds_sum", {"tool": "order_desk.query_order"}),
    }
    with django_capture_on_commit_callbacks(execute=True):
        publish_after_commit(run, rows, run_summary(run))
    assert _value("agentops_runs_total", labels) == before["runs"] + 1
    assert _value("agentops_run_steps_count") == before["steps"] + 1
    assert _value("agentops_llm_tokens_total", {"model": "demo/planner", "type": "input"}) == before["in"] + 120
    assert _value("agentops_llm_tokens_total", {"model": "demo/planner", "type": "output"}) == before["out"] + 30
    assert _value("agentops_llm_cost_total", {"model": "demo/planner"}) == pytest.approx(before["cost"] + 0.0015)
    assert _value("agentops_llm_request_duration_seconds_count", {"model": "demo/planner"}) == before["llm"] + 2
    assert _value("agentops_tool_calls_total", {"tool": "order_desk.query_order", "outcome": "ok"}) == before["tool"] + 1
    # the tool's latency is the gateway's audited one (tool.audit, 7 ms), counted once per call
    assert _value("agentops_tool_call_duration_seconds_sum", {"tool": "order_desk.query_order"}) == pytest.approx(before["tool_s"] + 0.007)


def test_metric_labels_carry_no_ids(worlds: Any) -> None:
    world, _ = worlds
    run = make_run(world)
    rows = list(RunEvent.objects.filter(run=run))
    for _metric, labels, _how, _amount in metrics.samples("order-assistant", 3, rows):
        for value in labels.values():
            assert str(run.pk) not in value and value != "c1" and world.operator.username not in value
