"""Every metric the shipped dashboard and alert rules name is exported by the live server's /metrics after demo runs.

Given runs that answer, one stopped by its step limit (max_recursion 1), one whose model has no provider, one waiting
for an approval (then approved) and one marked as needing attention, the scrapes have samples for the metrics those
produce. The few others (tool overruns and kills) need a hanging tool: they must be declared, by a family in the
scrape (embedded mode) or, in multiprocess mode where a family appears only once moved, by the metric modules the
server runs (their collectors in this process's registry).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

import agents.acceptance
import agents.metrics
import approvals.metrics
import tools.metrics
from accounts import services as tenant_services
from agents.models import Run
from approvals.models import ApprovalRequest
from tenants.models import Role
from tests.factories import make_user, make_world
from tests.support.dashboards import SCRAPE_SERIES, used_metric_names
from tests.support.refund_target import add_refund_tool, serve_refund_target

pytestmark = pytest.mark.integration

_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "summary": ("", "_sum", "_count", "_created"), "gauge": ("",), "unknown": ("",), "info": ("_info",),
             "stateset": ("",), "gaugehistogram": ("_bucket", "_gsum", "_gcount")}


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    with serve_refund_target() as url:
        yield url


def _start(http: httpx.Client, text: str) -> str:
    response = http.post("/api/v1/runs", json={"agent": "order-assistant", "input": text})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _scrape(live_stack: Any) -> tuple[set[str], set[str]]:
    """(sample names with at least one sample, sample names the declared families can produce)."""
    with live_stack.client() as http:
        response = http.get("/metrics")
    assert response.status_code == 200, response.text
    sampled, declared = set(), set()
    for family in text_string_to_metric_families(response.text):
        declared |= {family.name + suffix for suffix in _SUFFIXES[family.type]}
        sampled |= {sample.name for sample in family.samples}
    return sampled, declared


def _registered() -> set[str]:
    """Sample names the metric modules the server imports can produce (this process imported the same modules)."""
    assert agents.metrics.RUNS and tools.metrics.TOOL_KILLED and approvals.metrics.APPROVAL_DECISIONS
    assert agents.acceptance.ENQUEUE_FAILURES
    return {family.name + suffix for family in REGISTRY.collect() for suffix in _SUFFIXES[family.type]}


def test_every_metric_the_dashboard_and_alerts_use_is_exported(live_stack: Any, target: str, unblocked_db: None) -> None:
    # given: a tenant whose runs answer, one whose runs stop at their step limit, one whose refunds wait for approval
    answering, limited, desk = make_world(), make_world(max_recursion=1), make_world()
    unrouted = make_world(model="no-such-provider/model")
    add_refund_tool(desk, target)
    with live_stack.client(answering.raw_key) as http:
        answered = _start(http, "where is order O202411280001?")
    with live_stack.client(limited.raw_key) as http:
        stopped = _start(http, "where is order O202411280002?")
    with live_stack.client(unrouted.raw_key) as http:
        failed = _start(http, "where is order O202411280001?")
    with live_stack.client(desk.raw_key) as http:
        waiting = _start(http, "please refund order O202411280003")
    assert live_stack.wait_for_run(answering.raw_key, answered)["terminal_reason"] == "final_answer"
    assert live_stack.wait_for_run(limited.raw_key, stopped)["terminal_reason"] == "max_recursion"
    assert live_stack.wait_for_run(unrouted.raw_key, failed)["terminal_reason"] == "error"
    assert live_stack.wait_for_run(desk.raw_key, waiting, statuses=("waiting", "finished"))["status"] == "waiting"
    Run.objects.filter(pk=answered).update(needs_attention=True)  # as a write of unknown outcome would mark it

    # when: scraped while the refund waits, and again once an approver approved it
    sampled, declared = _scrape(live_stack)
    approver = make_user(f"{desk.tenant.slug}-approver")
    tenant_services.set_membership(tenant=desk.tenant, user=approver, role=Role.APPROVER, actor=None)
    _key, approver_key = tenant_services.create_api_key(tenant=desk.tenant, name="approver", owner=approver, role=Role.APPROVER,
                                                        actor=None)
    approval = ApprovalRequest.objects.get(run_id=waiting)
    with live_stack.client(approver_key) as http:
        response = http.post(f"/api/v1/approvals/{approval.pk}/approve", json={"note": "checked"})
        assert response.status_code == 200, response.text
    live_stack.wait_for_run(desk.raw_key, waiting)
    sampled_after, declared_after = _scrape(live_stack)
    sampled, declared = sampled | sampled_after, declared | declared_after

    # then: what the demo runs produce has samples ...
    used = used_metric_names()
    produced = {
        "agentops_runs_total", "agentops_run_limits_hit_total", "agentops_run_steps_bucket", "agentops_llm_tokens_total",
        "agentops_llm_cost_total", "agentops_llm_attempts_total", "agentops_llm_request_duration_seconds_bucket",
        "agentops_llm_errors_total", "agentops_approval_decisions_total",
        "agentops_tool_calls_total", "agentops_tool_call_duration_seconds_bucket", "agentops_approvals_pending",
        "agentops_approval_oldest_pending_seconds", "agentops_runs_active", "agentops_run_oldest_idle_seconds",
        "agentops_runs_needing_attention", "django_http_responses_total_by_status_total",
        "django_http_requests_latency_seconds_by_view_method_bucket",
    }
    assert produced <= used, f"the dashboard and rules no longer use {sorted(produced - used)}"
    assert not produced - sampled, f"no samples after the demo runs: {sorted(produced - sampled)}"
    # ... and every name the dashboard and rules use is exported (`up` is Prometheus's own, per scrape target)
    missing = sorted(used - SCRAPE_SERIES - sampled - declared - _registered())
    assert not missing, f"the dashboard or alert rules use metrics /metrics does not export: {missing}"
