"""Issue #49 item 3: erasing a session leaves its content in no table.

Generic on purpose: after erasing, every text and JSON column of every model (``apps.get_models()``) is searched for
a marker the conversation carried (a name the masking rules leave alone). The only rows allowed to keep it are the
append-only, hash-chained audit rows (``agents/erasure.py`` says why, and the tombstone counts them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import models
from django.test import Client

from accounts import services as tenant_services
from agents import model_clients, services
from agents.erasure import erase_session
from agents.models import Run, RunStatus
from approvals.decisions import decide
from approvals.models import ApprovalRequest, ApprovalStatus
from audit.chain import change_chain, verify_changes, verify_tenant
from audit.models import ConfigChange
from flows.models import FlowNodeRun
from marketplace.builtin import order_desk
from releases import services as releases
from releases.models import ReplayRun
from runtime.scripted import ScriptedModel, call, say
from tenants.models import Role
from tenants.scoping import Actor, actor_for_user
from tests.db.test_refund_desk import KEY, _drain
from tests.factories import World, make_user, make_world
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db

#: What the person said: a name (masking leaves names alone), ASCII so JSON columns hold it as written.
MARKER = "Quillon Marrowpatch"
TEXT_FIELDS = (models.TextField, models.CharField, models.JSONField)


def _kept_audit(model: type[models.Model], row: dict[str, Any], approvals: Collection[str]) -> bool:
    """The rows erasure keeps on purpose: tool-call audit rows, and the chained decisions on the erased approvals."""
    name = model._meta.label
    if name == "audit.ToolCallAudit":
        return True
    return name == "audit.ConfigChange" and row.get("target_type") == "ApprovalRequest" and row.get("target_id") in approvals


def _holders(marker: str, approvals: Collection[str] = ()) -> list[str]:
    """Every ``app.Model.field #pk`` whose value holds ``marker``, but for the audit rows erasure keeps."""
    found = []
    for model in apps.get_models():
        if model._meta.proxy or not model._meta.managed:
            continue
        fields = [f.attname for f in model._meta.concrete_fields if isinstance(f, TEXT_FIELDS)]
        if not fields:
            continue
        for row in model._base_manager.values(model._meta.pk.attname, *fields).iterator():  # target_* are CharFields
            if _kept_audit(model, row, approvals):
                continue
            for name in fields:
                value = row[name]
                text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
                if marker in text:
                    found.append(f"{model._meta.label}.{name} #{row[model._meta.pk.attname]}")
    return found


def _owner(world: World) -> Actor:
    owner = make_user(f"{world.tenant.slug}-owner")
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    return actor_for_user(owner)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[Any]], None]:
    def use(replies: list[Any]) -> None:
        model = ScriptedModel(replies)
        monkeypatch.setattr(model_clients, "model_client_for", lambda run: model)

    return use


def _agent_session(world: World, scripted: Callable[[list[Any]], None]) -> Run:
    """A finished exchange: the person names themself, the model looks the order up and answers by name."""
    scripted([call("query_order", {"order_id": "O202411280001"}), say(f"Dear {MARKER}, order O202411280001 ships today."),
              say(f"You are welcome, {MARKER}.")])
    actor = Actor(api_key=world.key)
    first = services.start_run(actor=actor, agent=world.agent, text=f"I am {MARKER}. Where is order O202411280001?")
    services.execute_run(str(first.pk))
    second = services.start_run(actor=actor, agent=world.agent, text=f"Thanks, {MARKER} here again.", session=first.session)
    services.execute_run(str(second.pk))
    first.refresh_from_db()
    assert first.status == RunStatus.FINISHED and MARKER in first.output
    return first


def _assert_erased(marker: str, run: Run, approvals: Collection[str] = ()) -> None:
    left = _holders(marker, approvals)
    assert left == [], f"erasure left the conversation in: {left}"
    # the audit rows kept are intact: both chains still verify
    assert verify_tenant(run.tenant_id)[1] is None and verify_changes(change_chain(run.tenant_id))[1] is None


def test_an_agent_session_leaves_nothing_behind(scripted: Callable[[list[Any]], None]) -> None:
    world = make_world()
    run = _agent_session(world, scripted)
    assert _holders(MARKER), "the conversation is stored before the erasure"

    erase_session(actor=_owner(world), session=run.session, reason="DSR-1")

    _assert_erased(MARKER, run)


@pytest.fixture
def demo(settings: Any, tmp_path: Any) -> Any:
    settings.DEMO_API_KEY, settings.DEMO_PASSWORD, settings.VAR_DIR = KEY, "refund-desk-password", tmp_path
    call_command("seed_demo")
    order_desk.REFUNDS.clear()
    return get_user_model()


def test_a_flow_session_with_an_edited_approval_leaves_nothing_behind(demo: Any) -> None:
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {KEY}")
    started = client.post("/api/v1/runs", {"flow": "refund-desk", "input": {
        "order_id": "O202411280001", "amount": "250.00", "reason": f"{MARKER} dropped the cup"}}, format="json")
    assert started.status_code == 202, started.content
    run = Run.objects.get(pk=started.json()["id"])
    services.execute_run(str(run.pk))
    _drain(run)
    approver = actor_for_user(demo.objects.get(username="approver"))
    edited = False
    while run.status == RunStatus.WAITING:
        request = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
        if request.tool_name == "refund_order":  # the approver rewrites the call's reason before approving it
            decide(actor=approver, request_id=request.pk, approve=True, note=f"checked with {MARKER}",
                   arguments={"reason": f"{MARKER}: cup broke in transit"})
            edited = True
        else:
            decide(actor=approver, request_id=request.pk, approve=True, note=f"ok for {MARKER}")
        assert services.resume_waiting_run(run.pk)
        services.execute_run(str(run.pk))
        _drain(run)
    assert edited and run.terminal_reason == "final_answer", run.error
    request = ApprovalRequest.objects.get(run=run, tool_name="refund_order")
    assert MARKER in json.dumps(request.edited_arguments)
    stored = _holders(MARKER)
    assert any(h.startswith("flows.FlowNodeRun.inputs") for h in stored), stored
    approvals = {str(pk) for pk in ApprovalRequest.objects.filter(run=run).values_list("pk", flat=True)}

    done = erase_session(actor=actor_for_user(demo.objects.get(username="admin")), session=run.session, reason="DSR-2")

    _assert_erased(MARKER, run, approvals)
    assert done.counts["flow_nodes"] == FlowNodeRun.objects.filter(run=run).count() > 0
    assert set(FlowNodeRun.objects.filter(run=run).values_list("status", flat=True)) <= {"done", "skipped"}
    request.refresh_from_db()
    assert (request.edited_arguments, request.status) == (None, ApprovalStatus.APPROVED) and request.edited_hash
    tombstone = ConfigChange.objects.get(action="session.erased", target_id=str(run.session_id))
    assert tombstone.details["kept"]["approval_changes"] >= 2


def test_a_session_in_an_evaluation_set_and_a_replay_leaves_nothing_behind(scripted: Callable[[list[Any]], None]) -> None:
    world = make_world()
    run = _agent_session(world, scripted)
    other = services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text="Where is order O202411280002?")
    scripted([say("Order O202411280002 ships tomorrow.")])
    services.execute_run(str(other.pk))
    operator = actor_for_user(world.operator)
    chosen = releases.create_evaluation_set(tenant=world.tenant, actor=operator, name="with-marker", agent=world.agent,
                                            filters={"limit": 50})
    batch = releases.start_replay(tenant=world.tenant, actor=operator, evaluation_set=chosen, candidate=world.version,
                                  concurrency=1, checks=[{"check": "no_diff"}])
    releases.run_shard(batch.pk, 0, 1)
    result = ReplayRun.objects.get(batch=batch, source_run=run)
    assert result.status == "replayed" and MARKER in json.dumps(result.diff), result.error
    api, browser = bearer_client(world.raw_key), Client()
    browser.force_login(world.operator)
    pages = (lambda: api.get(f"/api/v1/replays/{batch.pk}"), lambda: browser.get(f"/console/replays/{batch.pk}/"))
    assert all(page().status_code == 200 and MARKER in page().content.decode() for page in pages), "the report shows it"
    changed = result.diff["changed"]

    erase_session(actor=_owner(world), session=run.session, reason="DSR-3")

    _assert_erased(MARKER, run)
    result.refresh_from_db()
    assert (result.status, result.passed, result.diff) == ("replayed", True, {"changed": changed, "erased": True})
    assert "erased" in result.error
    assert not any(MARKER in page().content.decode() for page in pages), "the API and the console show it no more"
    batch.refresh_from_db()
    report = releases.batch_report(batch)
    assert report["passed"] == 3 and {r["source_run"] for r in report["results"]} >= {str(run.pk), str(other.pk)}
    # the set keeps the run as a member; a later replay reports it as erased
    again = releases.start_replay(tenant=world.tenant, actor=operator, evaluation_set=chosen, candidate=world.version,
                                  concurrency=1)
    releases.run_shard(again.pk, 0, 1)
    assert "erased" in ReplayRun.objects.get(batch=again, source_run=run).error
