"""Issue #13, item 5: a run whose write ended with an unknown outcome needs an operator's attention.

Marking goes through the real path: ``services.execute_run`` -> engine -> ToolGateway -> DjangoRunStore, with a
scripted model. A worker "dies" between a write's side effect and its step's commit (``commit_step`` raises a
BaseException, which nothing in the worker catches, so the lease stays behind); the resumed step finds the write's
``started`` row, reports ``outcome_unknown``, and the store marks the run in that step's transaction. Then: the API
field and filter, resolving (API, admin action, console form, all through ``agents.attention.resolve_attention``),
the console's badge and filter, and the ``agentops_runs_needing_attention`` gauge.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from accounts import services as tenant_services
from agents import attention, model_clients, services
from agents.engine import build_loop
from agents.models import Run, RunEvent
from agents.store import DjangoRunStore
from audit.chain import verify_changes
from audit.models import AuditChainHead, ConfigChange, ToolCallAudit
from console.metrics_view import _database_gauges
from runtime.scripted import ScriptedModel, call, say
from tenants.models import Role
from tenants.scoping import actor_for_user
from tests.e2e.builders import make_run
from tests.factories import World, make_user, make_world
from tests.support.clients import bearer_client
from tools.pyfunc import Param, registry, tool
from tools.services import install_python_tool

pytestmark = pytest.mark.django_db

#: How often the test write ran, per order: the side effect the operator must check.
REFUNDS: Counter[str] = Counter()
ORDER = "O202411280001"

if "test.attention.refund" not in registry:

    @tool(key="test.attention.refund", name="attention_refund", category="write", idempotent=False)
    def attention_refund(order_id: Annotated[str, Param(description="The order.")]) -> dict[str, Any]:
        """Refund an order (a side effect, not idempotent). Used to test runs that need attention."""
        REFUNDS[order_id] += 1
        return {"refunded": order_id}

    @tool(key="test.attention.slow_refund", name="attention_slow_refund", category="write", idempotent=False)
    def attention_slow_refund(order_id: Annotated[str, Param(description="The order.")]) -> dict[str, Any]:
        """Refund an order slowly (longer than its timeout). Used to test write timeouts."""
        time.sleep(1.0)
        REFUNDS[order_id] += 1
        return {"refunded": order_id}


class WorkerDied(BaseException):
    """Stands for SIGKILL: nothing in the worker catches it, so the lease stays behind."""


@pytest.fixture
def world() -> World:
    REFUNDS.clear()
    world = make_world()
    install_python_tool(tenant=world.tenant, key="test.attention.refund", actor=None)
    install_python_tool(tenant=world.tenant, key="test.attention.slow_refund", actor=None, timeout_seconds=0.2)
    world.version.tools = [*world.version.tools, "attention_refund", "attention_slow_refund"]
    world.version.save(update_fields=["tools"])
    return world


@pytest.fixture
def use_model(monkeypatch: pytest.MonkeyPatch) -> Callable[[ScriptedModel], ScriptedModel]:
    def use(model: ScriptedModel) -> ScriptedModel:
        monkeypatch.setattr(model_clients, "model_client_for", lambda run: model)
        return model

    return use


def _start(world: World, text: str = f"refund order {ORDER}") -> Run:
    return services.start_run(actor=actor_for_user(world.operator), agent=world.agent, text=text)


def _expire_lease(run: Run) -> None:
    expired = timezone.now() - dt.timedelta(seconds=1)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=expired, updated_at=expired - dt.timedelta(seconds=settings.RUN_LEASE_SECONDS))


def _die_before_the_write_step_commits(world: World, use_model: Any, monkeypatch: pytest.MonkeyPatch, run: Run) -> None:
    """A worker runs the write (its started row is committed, the refund happens) and dies before the step commits."""
    use_model(ScriptedModel([call("attention_refund", {"order_id": ORDER})]))
    real = DjangoRunStore.commit_step

    def die(self: DjangoRunStore, run_id: str, record: Any) -> Any:
        raise WorkerDied

    monkeypatch.setattr(DjangoRunStore, "commit_step", die)
    token = uuid.uuid4().hex
    taken = services.acquire_lease(str(run.pk), token)
    assert taken is not None
    with pytest.raises(WorkerDied):
        build_loop(taken, token).run(str(run.pk))
    monkeypatch.setattr(DjangoRunStore, "commit_step", real)


def _outcome_unknown_run(world: World, use_model: Any, monkeypatch: pytest.MonkeyPatch) -> Run:
    """A run that finished ``final_answer`` after its refund was cut off by a crash (outcome unknown)."""
    run = _start(world)
    _die_before_the_write_step_commits(world, use_model, monkeypatch, run)
    assert REFUNDS[ORDER] == 1 and ToolCallAudit.objects.get(run=run).status == "started"
    _expire_lease(run)
    use_model(ScriptedModel([call("attention_refund", {"order_id": ORDER}), say("An operator will check your refund.")]))
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    return run


def _operator_api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _marked(world: World, **fields: Any) -> Run:
    """A finished run already marked (for the API, admin and console tests; marking itself is tested above)."""
    run = make_run(world)
    reasons = [{"kind": "outcome_unknown", "tool": "attention_refund", "call_id": "call_1", "step": 2, "audit_id": 1,
                "at": timezone.now().isoformat()}]
    Run.objects.filter(pk=run.pk).update(needs_attention=True, attention_reasons=reasons, **fields)
    run.refresh_from_db()
    return run


def _gauge() -> dict[str, float]:
    return {s.labels["tenant"]: s.value for m in _database_gauges.collect() if m.name == "agentops_runs_needing_attention"
            for s in m.samples}


# -- marking, through the gateway and the store ------------------------------------------------------------------------


def test_a_write_cut_off_by_a_crash_marks_the_run_in_the_step_that_reports_it(
    world: World, use_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _outcome_unknown_run(world, use_model, monkeypatch)
    # then the refund was not repeated, the run still ends as a final answer ...
    assert REFUNDS[ORDER] == 1
    assert (run.status, run.terminal_reason, run.crash_count) == ("finished", "final_answer", 1)
    row = ToolCallAudit.objects.get(run=run)
    assert row.status == "outcome_unknown"
    # ... but it needs attention, saying which call of which tool to check
    assert run.needs_attention is True
    assert len(run.attention_reasons) == 1
    reason = run.attention_reasons[0]
    assert {k: reason[k] for k in ("kind", "tool", "call_id", "step", "audit_id")} == {
        "kind": "outcome_unknown", "tool": "attention_refund", "call_id": row.call_id, "step": row.step, "audit_id": row.pk,
    }
    assert dt.datetime.fromisoformat(reason["at"]) <= timezone.now()
    # and the trace says so, in the step that reported it, under the tool call, before the run finished
    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, run.last_seq + 1))
    marks = [e for e in events if e.type == attention.NEEDS_ATTENTION_EVENT]
    assert len(marks) == 1 and marks[0].step == row.step
    assert marks[0].payload["kind"] == "outcome_unknown" and marks[0].payload["call_id"] == row.call_id
    assert "attention_refund" in marks[0].payload["message"]
    assert marks[0].parent_span_id == row.span_id
    finished = next(e for e in events if e.type == "run.finished")
    assert marks[0].seq < finished.seq


def test_marking_costs_no_query_of_its_own(world: World, use_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # given two runs whose first step is the same write: one cut off by a crash (outcome unknown), one not
    def step_queries(run: Run, *, crashed: bool) -> int:
        if crashed:
            _die_before_the_write_step_commits(world, use_model, monkeypatch, run)
            _expire_lease(run)
        use_model(ScriptedModel([call("attention_refund", {"order_id": ORDER}), say("done")]))
        counted: dict[str, int] = {}
        real = DjangoRunStore.commit_step

        def measured(self: DjangoRunStore, run_id: str, record: Any) -> Any:
            with CaptureQueriesContext(connection) as queries:
                ack = real(self, run_id, record)
            counted.setdefault("first", len(queries))
            return ack

        monkeypatch.setattr(DjangoRunStore, "commit_step", measured)
        services.execute_run(str(run.pk))
        monkeypatch.setattr(DjangoRunStore, "commit_step", real)
        return counted["first"]

    # (the tenant's chain head exists already: its very first audit row creates it, two statements more)
    AuditChainHead.objects.get_or_create(tenant_id=world.tenant.pk)
    plain = step_queries(_start(world), crashed=False)
    unknown_run = _start(world)
    unknown = step_queries(unknown_run, crashed=True)
    assert Run.objects.get(pk=unknown_run.pk).needs_attention
    assert not Run.objects.exclude(pk=unknown_run.pk).filter(needs_attention=True).exists()
    # then committing the step that marks the run costs what committing the same step unmarked costs
    assert unknown == plain, (unknown, plain)


def test_a_write_that_times_out_needs_attention_and_a_read_or_a_finished_write_does_not(world: World, use_model: Any) -> None:
    run = _start(world)
    use_model(ScriptedModel([
        call("order_desk.query_order", {"order_id": ORDER}),
        call("attention_refund", {"order_id": "O202411280002"}),
        call("attention_slow_refund", {"order_id": "O202411280003"}),
        say("done"),
    ]))
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert run.terminal_reason == "final_answer", run.error
    statuses = dict(ToolCallAudit.objects.filter(run=run).values_list("tool_name", "status"))
    assert statuses["attention_refund"] == "ok" and statuses["attention_slow_refund"] == "timeout", statuses
    assert run.needs_attention
    assert [(r["kind"], r["tool"]) for r in run.attention_reasons] == [("write_timeout", "attention_slow_refund")]


def test_a_run_without_unknown_outcomes_is_not_marked(world: World, use_model: Any) -> None:
    run = _start(world)
    use_model(ScriptedModel([call("attention_refund", {"order_id": ORDER}), say("refunded")]))
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert (run.terminal_reason, run.needs_attention, run.attention_reasons) == ("final_answer", False, [])
    assert not RunEvent.objects.filter(run=run, type=attention.NEEDS_ATTENTION_EVENT).exists()


def test_a_crash_loop_needs_attention_and_lists_the_write_left_unfinished(
    world: World, use_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _start(world)
    _die_before_the_write_step_commits(world, use_model, monkeypatch, run)  # crash 1 leaves the write started
    for _ in range(services.MAX_CRASHES - 1):
        _expire_lease(run)
        use_model(ScriptedModel([lambda request: (_ for _ in ()).throw(WorkerDied())]))
        token = uuid.uuid4().hex
        taken = services.acquire_lease(str(run.pk), token)
        assert taken is not None
        with pytest.raises(WorkerDied):
            build_loop(taken, token).run(str(run.pk))
    _expire_lease(run)
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert (run.terminal_reason, run.crash_count) == ("error", services.MAX_CRASHES) and run.error.startswith("crash_loop")
    started = ToolCallAudit.objects.get(run=run)
    assert started.status == "started"
    assert run.needs_attention
    [reason] = run.attention_reasons
    assert reason["kind"] == "crash_loop" and reason["crash_count"] == services.MAX_CRASHES
    assert [(w["tool"], w["audit_id"]) for w in reason["unfinished_writes"]] == [("attention_refund", started.pk)]
    types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert types[-3:] == [attention.NEEDS_ATTENTION_EVENT, "state.transition", "run.finished"]
    assert list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True)) == list(range(1, run.last_seq + 1))


# -- the API ---------------------------------------------------------------------------------------------------------


def test_the_api_shows_why_a_run_needs_attention_and_filters_on_it(
    world: World, use_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    marked = _outcome_unknown_run(world, use_model, monkeypatch)
    plain = make_run(world)
    api = _operator_api(world)
    body = api.get(f"/api/v1/runs/{marked.pk}").json()
    assert body["needs_attention"] is True
    assert [(r["kind"], r["tool"]) for r in body["attention_reasons"]] == [("outcome_unknown", "attention_refund")]
    assert (body["attention_resolved_at"], body["attention_resolved_by"], body["attention_resolution"]) == (None, None, "")
    assert api.get(f"/api/v1/runs/{plain.pk}").json()["needs_attention"] is False

    def ids(query: str) -> set[str]:
        response = api.get(f"/api/v1/runs{query}")
        assert response.status_code == 200, response.content
        return {r["id"] for r in response.json()["results"]}

    assert ids("?needs_attention=true") == {str(marked.pk)}
    assert ids("?needs_attention=false") == {str(plain.pk)}
    assert ids("") == {str(marked.pk), str(plain.pk)}
    bad = api.get("/api/v1/runs?needs_attention=maybe")
    assert bad.status_code == 400
    assert bad.json()["needs_attention"] == ["Must be true or false; got 'maybe'."]
    assert bad.json()["error"] == {"code": "invalid", "message": "Must be true or false; got 'maybe'.", "field": "needs_attention"}


def test_resolving_through_the_api_is_audited_with_the_actor_and_happens_once(world: World) -> None:
    run = _marked(world)
    api = _operator_api(world)
    url = f"/api/v1/runs/{run.pk}/resolve-attention"
    # a note is required
    missing = api.post(url, {}, format="json")
    assert missing.status_code == 400 and "note" in missing.json()
    assert api.post(url, {"note": "   "}, format="json").status_code == 400
    assert Run.objects.get(pk=run.pk).needs_attention
    # when the operator says what they checked
    response = api.post(url, {"note": "Checked the payment provider: refunded once. Call +8613812345678 if asked."},
                        format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["needs_attention"] is False and body["attention_resolved_by"] == world.operator.username
    assert body["attention_resolution"].startswith("Checked the payment provider: refunded once.")
    assert "13812345678" not in body["attention_resolution"], "personal data in the note is masked"
    assert body["attention_reasons"] == run.attention_reasons, "the reasons stay, for history"
    run.refresh_from_db()
    assert run.attention_resolved_at is not None and run.attention_resolved_by == world.operator
    # then one configuration-change row records who (the key's owner), with the key, the note and what was open
    change = ConfigChange.objects.get(tenant=world.tenant, action=attention.RESOLVED_ACTION)
    assert change.actor == world.operator and change.target_id == str(run.pk)
    assert change.details["via"] == "api" and change.details["api_key"]["id"] == world.key.pk
    assert change.details["note"] == run.attention_resolution
    assert [r["kind"] for r in change.details["reasons"]] == ["outcome_unknown"]
    assert verify_changes(f"tenant:{world.tenant.pk}")[1] is None
    assert RunEvent.objects.filter(run=run, type=attention.RESOLVED_EVENT).count() == 1
    # and a second resolution is a 409 that changes nothing
    again = api.post(url, {"note": "again"}, format="json")
    assert again.status_code == 409 and "does not need attention" in again.json()["detail"]
    assert ConfigChange.objects.filter(action=attention.RESOLVED_ACTION).count() == 1


def test_resolving_needs_the_operate_scope_and_a_foreign_tenants_run_is_not_found(world: World) -> None:
    run = _marked(world)
    url = f"/api/v1/runs/{run.pk}/resolve-attention"
    # a viewer's key sees the run but may not resolve it
    _key, raw = tenant_services.create_api_key(tenant=world.tenant, name="viewer", owner=world.viewer, role=Role.VIEWER, actor=None)
    viewer = APIClient()
    viewer.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert viewer.get(f"/api/v1/runs/{run.pk}").json()["needs_attention"] is True
    assert viewer.post(url, {"note": "checked"}, format="json").status_code == 403
    # another tenant's operator key does not find it at all
    other = _operator_api(make_world())
    assert other.get(f"/api/v1/runs/{run.pk}").status_code == 404
    assert other.post(url, {"note": "checked"}, format="json").status_code == 404
    assert other.get("/api/v1/runs?needs_attention=true").json()["results"] == []
    assert Run.objects.get(pk=run.pk).needs_attention
    assert not ConfigChange.objects.filter(action=attention.RESOLVED_ACTION).exists()


def test_a_run_marked_again_after_resolution_needs_a_new_resolution(world: World) -> None:
    run = _marked(world)
    attention.resolve_attention(actor=actor_for_user(world.operator), run=run, note="checked", via="test")
    later = {"kind": "write_timeout", "tool": "attention_slow_refund", "call_id": "call_2", "step": 3, "audit_id": 2,
             "at": timezone.now().isoformat()}
    with transaction.atomic():
        attention.mark_needs_attention(run, [later])
    run.refresh_from_db()
    assert run.needs_attention and len(run.attention_reasons) == 2
    assert attention.open_reasons(run) == [later], "only what came after the last resolution is open"
    resolved = attention.resolve_attention(actor=actor_for_user(world.operator), run=run, note="checked the second", via="test")
    assert not resolved.needs_attention
    last = ConfigChange.objects.filter(action=attention.RESOLVED_ACTION).order_by("-pk").first()
    assert last is not None and [r["kind"] for r in last.details["reasons"]] == ["write_timeout"]


# -- the admin ----------------------------------------------------------------------------------------------------------


def _admin(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_filters_badges_and_resolves_through_the_service(world: World) -> None:
    marked, plain = _marked(world), make_run(world)
    other = make_world()
    foreign = _marked(other)
    client = _admin(world.operator)
    changelist = reverse("admin:agents_run_changelist")
    page = client.get(changelist, {"needs_attention__exact": "1"})
    assert page.status_code == 200
    html = page.content.decode()
    assert str(marked.pk) in html and str(plain.pk) not in html and str(foreign.pk) not in html
    assert 'class="attention-badge"' in html and "agents/admin.css" in html
    assert str(plain.pk) in client.get(changelist, {"needs_attention__exact": "0"}).content.decode()
    # the action asks what was checked first; the foreign run is not among what it offers
    ask = client.post(changelist, {"action": "resolve_attention", "_selected_action": [marked.pk, plain.pk, foreign.pk]})
    assert ask.status_code == 200 and b'name="note"' in ask.content and str(marked.pk).encode() in ask.content
    assert str(foreign.pk).encode() not in ask.content
    assert Run.objects.get(pk=marked.pk).needs_attention
    empty = client.post(changelist, {"action": "resolve_attention", "_selected_action": [marked.pk], "confirmed": "yes", "note": ""})
    assert empty.status_code == 200 and b"Say what you checked" in empty.content
    done = client.post(changelist, {"action": "resolve_attention", "_selected_action": [marked.pk, foreign.pk], "confirmed": "yes",
                                    "note": "refund checked at the provider"})
    assert done.status_code == 302
    marked.refresh_from_db()
    assert not marked.needs_attention and marked.attention_resolved_by == world.operator
    assert marked.attention_resolution == "refund checked at the provider"
    change = ConfigChange.objects.get(action=attention.RESOLVED_ACTION)
    assert change.actor == world.operator and change.details["via"] == "admin" and change.tenant == world.tenant
    assert Run.objects.get(pk=foreign.pk).needs_attention, "another tenant's run is never resolved from here"
    assert b"resolved" in client.get(changelist).content


def test_the_admin_action_is_for_operators(world: World) -> None:
    _marked(world)
    changelist = reverse("admin:agents_run_changelist")
    assert b"resolve_attention" in _admin(world.operator).get(changelist).content
    viewer = _admin(world.viewer)
    assert viewer.get(changelist).status_code == 200
    assert b"resolve_attention" not in viewer.get(changelist).content


# -- the console ------------------------------------------------------------------------------------------------------------


def test_the_console_badges_filters_and_resolves(world: World) -> None:
    marked, plain = _marked(world), make_run(world)
    client = _admin(world.operator)
    runs = client.get("/console/runs/").content.decode()
    assert runs.count('class="badge attention"') == 1 and 'data-filter-attention=""' in runs
    only = client.get("/console/runs/", {"attention": "1"}).content.decode()
    assert str(marked.pk)[:8] in only and str(plain.pk)[:8] not in only and 'data-filter-attention="1"' in only
    others = client.get("/console/runs/", {"attention": "0"}).content.decode()
    assert str(plain.pk)[:8] in others and str(marked.pk)[:8] not in others
    assert "attention must be 1" in client.get("/console/runs/", {"attention": "yes"}).content.decode()
    # the run page shows the badge, what to check and the form
    page = client.get(f"/console/runs/{marked.pk}/").content.decode()
    assert 'id="run-attention"' in page and "attention_refund" in page and 'name="note"' in page
    assert "csrfmiddlewaretoken" in page
    assert 'id="run-attention"' not in client.get(f"/console/runs/{plain.pk}/").content.decode()
    url = reverse("console:run-resolve-attention", args=[marked.pk])
    # a note is required
    response = client.post(url, {"note": ""})
    assert response.status_code == 302 and Run.objects.get(pk=marked.pk).needs_attention
    assert "Say what you checked" in client.get(f"/console/runs/{marked.pk}/").content.decode()
    # when resolved
    assert client.post(url, {"note": "checked at the provider"}).status_code == 302
    marked.refresh_from_db()
    assert not marked.needs_attention and marked.attention_resolved_by == world.operator
    assert ConfigChange.objects.get(action=attention.RESOLVED_ACTION).details["via"] == "console"
    page = client.get(f"/console/runs/{marked.pk}/").content.decode()
    assert 'id="run-attention"' not in page and "checked at the provider" in page
    # and a second time changes nothing
    client.post(url, {"note": "again"})
    assert ConfigChange.objects.filter(action=attention.RESOLVED_ACTION).count() == 1


def test_the_console_form_is_for_operators_of_the_runs_tenant(world: World) -> None:
    run = _marked(world)
    url = reverse("console:run-resolve-attention", args=[run.pk])
    viewer = _admin(world.viewer)
    page = viewer.get(f"/console/runs/{run.pk}/").content.decode()
    assert 'id="run-attention"' in page and 'name="note"' not in page
    assert viewer.post(url, {"note": "checked"}).status_code == 403
    outsider = _admin(make_world().operator)
    assert outsider.post(url, {"note": "checked"}).status_code == 404
    assert Client().post(url, {"note": "checked"}).status_code == 302  # to the login page
    csrf = Client(enforce_csrf_checks=True)
    csrf.force_login(world.operator)
    assert csrf.post(url, {"note": "checked"}).status_code == 403
    assert Run.objects.get(pk=run.pk).needs_attention


# -- the metric and the command ---------------------------------------------------------------------------------------------


def test_the_gauge_counts_runs_needing_attention_per_tenant(world: World, client: Any) -> None:
    other = make_world()
    first, _second, _theirs = _marked(world), _marked(world), _marked(other)
    make_run(world)
    assert _gauge() == {world.tenant.slug: 2.0, other.tenant.slug: 1.0}
    scraped = client.get("/metrics").content.decode()
    assert f'agentops_runs_needing_attention{{tenant="{world.tenant.slug}"}} 2.0' in scraped
    attention.resolve_attention(actor=actor_for_user(world.operator), run=first, note="checked", via="test")
    assert _gauge() == {world.tenant.slug: 1.0, other.tenant.slug: 1.0}
    with CaptureQueriesContext(connection) as queries:
        list(_database_gauges.collect())
    assert len([q for q in queries if "needs_attention" in q["sql"]]) == 1, "one grouped count per scrape"


def test_the_command_lists_and_resolves(world: World) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    run = _marked(world)
    out = StringIO()
    call_command("resolve_attention", stdout=out)
    assert str(run.pk) in out.getvalue() and "attention_refund" in out.getvalue()
    with pytest.raises(CommandError, match="--by"):
        call_command("resolve_attention", str(run.pk), note="checked")
    outsider = make_user()
    with pytest.raises(CommandError, match="not an operator"):
        call_command("resolve_attention", str(run.pk), by=outsider.username, note="checked")
    call_command("resolve_attention", str(run.pk), by=world.operator.username, note="checked by hand", stdout=StringIO())
    run.refresh_from_db()
    assert not run.needs_attention and run.attention_resolved_by == world.operator
    assert ConfigChange.objects.get(action=attention.RESOLVED_ACTION).details["via"] == "command"
    with pytest.raises(CommandError, match="does not need attention"):
        call_command("resolve_attention", str(run.pk), by=world.operator.username, note="again")
