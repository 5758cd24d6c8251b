"""Sessions as a resource (issue #13, item 9): list, detail, and erasure for a data-subject request."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.test import APIClient

from accounts import services as tenant_services
from agents import services
from agents.models import Agent, AgentVersion, Run, RunEvent, RunMessage, RunStatus, Session, Turn
from approvals.models import ApprovalRequest, ApprovalStatus
from audit.models import ConfigChange, ToolCallAudit
from tenants.models import Role
from tenants.scoping import actor_for_api_key
from tests.factories import World, make_user, make_world
from tools.models import Tool, ToolKind
from tools.services import install_python_tool

pytestmark = pytest.mark.django_db

#: A name the masking rules leave alone: personal data that only erasure removes.
NAME = "Ada Quillfeather"
FIRST = f"Hi, I am {NAME}. Where is order O202411280001?"
SECOND = f"refund 30.00 for order O202411280001 because {NAME}'s glass cup broke"


@dataclass
class Setup:
    world: World
    owner: Any
    owner_key: str
    viewer_key: str


@pytest.fixture
def setup() -> Setup:
    world = make_world()
    owner = make_user(f"{world.tenant.slug}-owner", is_staff=True)
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    _key, owner_raw = tenant_services.create_api_key(tenant=world.tenant, name="dpo", owner=owner, role=Role.OWNER, actor=None)
    _key, viewer_raw = tenant_services.create_api_key(tenant=world.tenant, name="ro", owner=owner, role=Role.VIEWER, actor=None)
    refund = install_python_tool(tenant=world.tenant, key="order_desk.refund_order", actor=None, requires_approval=True)
    version = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner",
                                          system_prompt="You answer questions about orders.",
                                          tools=[*world.version.tools, refund.name], policy={"limits": {"max_recursion": 6}})
    world.agent.current_version = version
    world.agent.save(update_fields=["current_version"])
    return Setup(world, owner, owner_raw, viewer_raw)


def _client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _conversation(world: World) -> tuple[Session, Run, Run]:
    """A finished exchange, then a refund waiting for approval, in one session; the user names themself in both."""
    actor = actor_for_api_key(world.key)
    first = services.start_run(actor=actor, agent=world.agent, text=FIRST)
    services.execute_run(str(first.pk))
    second = services.start_run(actor=actor, agent=world.agent, text=SECOND, session=first.session)
    services.execute_run(str(second.pk))
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, second.status) == (RunStatus.FINISHED, RunStatus.WAITING)
    return first.session, first, second


def _stored_text(session_ids: list[Any]) -> str:
    """Everything the database holds for these sessions' runs, messages, events, turns and approvals, as one text."""
    runs = Run.objects.filter(session_id__in=session_ids)
    parts: list[Any] = [list(runs.values("input", "output", "error", "facts", "state", "pending_calls"))]
    parts.append(list(RunMessage.objects.filter(run__in=runs).values_list("message", flat=True)))
    parts.append(list(RunEvent.objects.filter(run__in=runs).values_list("payload", flat=True)))
    parts.append(list(Turn.objects.filter(session_id__in=session_ids).values("user_message", "assistant_message")))
    parts.append(list(ApprovalRequest.objects.filter(run__in=runs).values("arguments", "preview")))
    parts.append(list(Session.objects.filter(pk__in=session_ids).values_list("facts", flat=True)))
    return json.dumps(parts, ensure_ascii=False, default=str)


# -- reading ----------------------------------------------------------------------------------------------------------


def test_the_list_is_newest_first_in_cursor_pages_and_filters_by_agent_and_erasure(setup: Setup) -> None:
    world = setup.world
    actor = actor_for_api_key(world.key)
    older = services.start_run(actor=actor, agent=world.agent, text="where is order O202411280001?").session
    other_agent = Agent.objects.create(tenant=world.tenant, slug="front-desk", name="Front desk")
    version = AgentVersion.objects.create(tenant=world.tenant, agent=other_agent, number=1, model="demo/planner", tools=[])
    other_agent.current_version = version
    other_agent.save(update_fields=["current_version"])
    newer = services.start_run(actor=actor, agent=other_agent, text="hello").session
    Session.objects.filter(pk=older.pk).update(erased_at=older.created_at)
    client = _client(setup.viewer_key)

    body = client.get("/api/v1/sessions?limit=1").json()
    assert [s["id"] for s in body["results"]] == [str(newer.pk)] and body["next"]
    assert [s["id"] for s in client.get(body["next"]).json()["results"]] == [str(older.pk)]
    row = body["results"][0]
    assert row["agent"] == "front-desk" and row["run_count"] == 1 and row["erased"] is False
    assert row["links"]["self"].endswith(f"/api/v1/sessions/{newer.pk}")

    by_agent = client.get("/api/v1/sessions?agent=order-assistant").json()["results"]
    assert [s["id"] for s in by_agent] == [str(older.pk)]
    assert [s["id"] for s in client.get("/api/v1/sessions?erased=true").json()["results"]] == [str(older.pk)]
    assert [s["id"] for s in client.get("/api/v1/sessions?erased=false").json()["results"]] == [str(newer.pk)]
    bad = client.get("/api/v1/sessions?erased=maybe")
    assert bad.status_code == 400 and "Must be true or false" in bad.json()["erased"][0]


def test_the_detail_has_the_agent_turns_usage_model_calls_and_runs(setup: Setup) -> None:
    session, first, second = _conversation(setup.world)
    body = _client(setup.viewer_key).get(f"/api/v1/sessions/{session.pk}").json()
    assert body["agent"] == "order-assistant" and body["created_at"] and body["erased"] is False
    assert body["turns"] == [{"seq": 1, "run": str(first.pk), "input": FIRST, "output": first.output,
                              "created_at": body["turns"][0]["created_at"]}]
    assert body["turn_count"] == 1 and body["model_calls"] == 2 and body["usage"]["input_tokens"] > 0
    assert [(r["id"], r["status"], r["terminal_reason"]) for r in body["runs"]] == [
        (str(first.pk), "finished", "final_answer"), (str(second.pk), "waiting", "")]
    assert body["runs"][0]["links"]["self"].endswith(f"/api/v1/runs/{first.pk}")
    assert body["runs"][0]["links"]["ws"].startswith("ws://")


# -- erasure ----------------------------------------------------------------------------------------------------------


def test_erasure_removes_inputs_messages_events_turns_and_approval_arguments_and_keeps_a_tombstone(setup: Setup) -> None:
    world = setup.world
    session, first, second = _conversation(world)
    assert NAME in _stored_text([session.pk])
    audits = set(ToolCallAudit.objects.filter(session=session).values_list("pk", "row_hash"))
    assert audits
    owner = _client(setup.owner_key)

    # while a run of the session waits for approval, erasure is refused: cancel first
    refused = owner.delete(f"/api/v1/sessions/{session.pk}")
    assert refused.status_code == 409 and "cancel" in refused.json()["detail"] and str(second.pk) in refused.json()["detail"]
    assert NAME in _stored_text([session.pk]) and not ConfigChange.objects.filter(action="session.erased").exists()
    assert owner.post(f"/api/v1/runs/{second.pk}/cancel").status_code == 202

    response = owner.delete(f"/api/v1/sessions/{session.pk}?reason=DSR-1234")
    assert response.status_code == 204

    # nothing of what the person said or was told is left in runs, messages, events, turns or approvals
    assert NAME not in _stored_text([session.pk])
    assert not RunMessage.objects.filter(run__session=session).exists()
    assert not RunEvent.objects.filter(run__session=session).exists()
    assert not Turn.objects.filter(session=session).exists()
    for run in Run.objects.filter(session=session):
        assert (run.input, run.output, run.error, run.facts, run.state, run.pending_calls) == ("", "", "", {}, {}, [])
        assert (run.last_seq, run.message_count, run.status) == (0, 0, RunStatus.FINISHED)
    approval = ApprovalRequest.objects.get(run=second)
    assert (approval.arguments, approval.preview, approval.status) == ({}, {}, ApprovalStatus.CANCELLED)
    # the tool-call audit (append-only, hash-chained) is untouched
    assert set(ToolCallAudit.objects.filter(session=session).values_list("pk", "row_hash")) == audits
    session.refresh_from_db()
    assert session.erased_at is not None and session.erased_by == setup.owner

    # exactly one tombstone: who, how, why and the counts, none of the content
    tombstone = ConfigChange.objects.get(action="session.erased")
    assert tombstone.actor == setup.owner and tombstone.tenant == world.tenant and tombstone.target_id == str(session.pk)
    details = tombstone.details
    assert details["via"] == "api" and details["reason"] == "DSR-1234" and details["api_key"]["prefix"]
    assert setup.owner_key.startswith(details["api_key"]["prefix"])
    assert details["counts"] == {"sessions": 1, "runs": 2, "messages": details["counts"]["messages"], "events": details["counts"]["events"],
                                 "turns": 1, "approvals": 1, "approval_notes": 0, "flow_nodes": 0, "replay_results": 0}
    assert details["counts"]["messages"] >= 4 and details["counts"]["events"] >= 10
    assert details["kept"]["tool_call_audits"] == len(audits)
    assert NAME not in json.dumps(details) and "glass cup" not in json.dumps(details)

    # erasing again answers 204 and records nothing new
    assert owner.delete(f"/api/v1/sessions/{session.pk}").status_code == 204
    assert ConfigChange.objects.filter(action="session.erased").count() == 1
    session.refresh_from_db()
    assert session.erased_by == setup.owner

    # the runs still read: their erased fields blank, no events; the session says it is erased
    reader = _client(setup.viewer_key)
    detail = reader.get(f"/api/v1/runs/{first.pk}")
    assert detail.status_code == 200
    assert (detail.json()["input"], detail.json()["output"], detail.json()["status"]) == ("", "", "finished")
    events = reader.get(f"/api/v1/runs/{first.pk}/events?after=0").json()
    assert events["events"] == [] and events["has_more"] is False
    erased = reader.get(f"/api/v1/sessions/{session.pk}").json()
    assert erased["erased"] is True and erased["erased_by"] == setup.owner.username and erased["turns"] == []
    assert len(erased["runs"]) == 2

    # and no new run may join the erased session
    joined = _client(world.raw_key).post("/api/v1/runs", {"agent": "order-assistant", "input": "hi", "session": str(session.pk)},
                                          format="json")
    assert joined.status_code == 400 and "erased" in joined.json()["session"][0]


@pytest.mark.django_db(transaction=True)  # the child run executes in the gateway's worker thread (its own connection)
def test_sessions_an_agent_tool_started_are_erased_with_the_session(setup: Setup) -> None:
    world = setup.world
    parameters = {"type": "object", "required": ["order_id"],
                  "properties": {"order_id": {"type": "string", "pattern": "^O\\d{12}$", "description": "The order number."}}}
    tool = Tool.objects.create(tenant=world.tenant, name="ask_orders", description="Ask the order assistant about an order.",
                               kind=ToolKind.AGENT, parameters=parameters, config={"agent": "order-assistant"}, timeout_seconds=60)
    desk = Agent.objects.create(tenant=world.tenant, slug="front-desk", name="Front desk")
    desk.current_version = AgentVersion.objects.create(tenant=world.tenant, agent=desk, number=1, model="demo/planner",
                                                       tools=[tool.name])
    desk.save(update_fields=["current_version"])
    parent = services.start_run(actor=actor_for_api_key(world.key), agent=desk,
                                text=f"{NAME} asks: what is the status of order O202411280001?")
    services.execute_run(str(parent.pk))
    child = Run.objects.get(facts__parent_run=str(parent.pk))
    assert child.session_id != parent.session_id
    ids = [parent.session_id, child.session_id]
    # the child's input is what the parent's model derived from the conversation
    assert NAME in _stored_text(ids[:1]) and "O202411280001" in child.input and RunMessage.objects.filter(run=child).exists()

    assert _client(setup.owner_key).delete(f"/api/v1/sessions/{parent.session_id}").status_code == 204

    assert NAME not in _stored_text(ids) and "O202411280001" not in _stored_text(ids)
    assert Session.objects.filter(pk__in=ids, erased_at__isnull=False).count() == 2
    tombstone = ConfigChange.objects.get(action="session.erased")
    assert tombstone.details["sessions"] == [str(i) for i in ids] and tombstone.details["counts"]["sessions"] == 2


def test_a_foreign_tenant_gets_404_and_a_view_only_or_operator_key_cannot_erase(setup: Setup) -> None:
    world = setup.world
    session = services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text=FIRST).session
    Run.objects.filter(session=session).update(status=RunStatus.FINISHED)
    stranger = make_world()
    foreign = _client(stranger.raw_key)
    assert foreign.get(f"/api/v1/sessions/{session.pk}").status_code == 404
    assert foreign.delete(f"/api/v1/sessions/{session.pk}").status_code == 404
    assert str(session.pk) not in json.dumps(foreign.get("/api/v1/sessions").json())

    viewer = _client(setup.viewer_key)
    assert viewer.get(f"/api/v1/sessions/{session.pk}").status_code == 200
    assert viewer.delete(f"/api/v1/sessions/{session.pk}").status_code == 403
    operator = _client(world.raw_key)  # erasing is the tenant owner's decision (agents/erasure.py: ERASE_ACTION)
    assert operator.delete(f"/api/v1/sessions/{session.pk}").status_code == 403
    session.refresh_from_db()
    assert session.erased_at is None and Run.objects.get(session=session).input == FIRST
    assert not ConfigChange.objects.filter(action="session.erased").exists()


def test_the_management_command_erases_through_the_same_service(setup: Setup) -> None:
    world = setup.world
    session, _first, second = _conversation(world)
    slug = world.tenant.slug
    with pytest.raises(CommandError, match="cancel"):
        call_command("erase_session", str(session.pk), tenant=slug, reason="DSR-7", by=setup.owner.username)
    services.cancel_run(actor=actor_for_api_key(world.key), run=second)
    with pytest.raises(CommandError, match="No session"):
        call_command("erase_session", str(session.pk), tenant=make_world().tenant.slug, reason="DSR-7")
    with pytest.raises(CommandError, match="not an owner"):
        call_command("erase_session", str(session.pk), tenant=slug, reason="DSR-7", by=world.operator.username)

    call_command("erase_session", str(session.pk), tenant=slug, reason="DSR-7", by=setup.owner.username)

    assert NAME not in _stored_text([session.pk])
    tombstone = ConfigChange.objects.get(action="session.erased")
    assert (tombstone.actor, tombstone.details["via"], tombstone.details["reason"]) == (setup.owner, "command", "DSR-7")
    assert tombstone.details["api_key"] is None and tombstone.details["counts"]["runs"] == 2
    call_command("erase_session", str(session.pk), tenant=slug, reason="DSR-7")  # again: nothing changes
    assert ConfigChange.objects.filter(action="session.erased").count() == 1


def test_the_admin_action_asks_for_a_reason_then_erases_through_the_same_service(setup: Setup) -> None:
    session = services.start_run(actor=actor_for_api_key(setup.world.key), agent=setup.world.agent, text=FIRST).session
    Run.objects.filter(session=session).update(status=RunStatus.FINISHED)
    url = "/admin/agents/session/"
    operator = Client()
    operator.force_login(setup.world.operator)
    assert b"erase_sessions" not in operator.get(url).content  # only owners are offered the action
    owner = Client()
    owner.force_login(setup.owner)
    selected = {"action": "erase_sessions", "_selected_action": [str(session.pk)]}

    confirm = owner.post(url, selected)
    assert confirm.status_code == 200 and b"Erasing cannot be undone" in confirm.content
    assert Session.objects.get(pk=session.pk).erased_at is None

    done = owner.post(url, {**selected, "confirmed": "yes", "reason": "DSR-9"})
    assert done.status_code == 302
    assert Session.objects.get(pk=session.pk).erased_at is not None and Run.objects.get(session=session).input == ""
    tombstone = ConfigChange.objects.get(action="session.erased")
    assert (tombstone.actor, tombstone.details["via"], tombstone.details["reason"]) == (setup.owner, "admin", "DSR-9")


def test_the_sessions_api_is_in_the_openapi_schema(client: Any) -> None:
    schema = client.get("/api/schema/?format=json").json()
    assert {"get"} <= set(schema["paths"]["/api/v1/sessions"])
    detail = schema["paths"]["/api/v1/sessions/{id}"]
    assert {"get", "delete"} <= set(detail)
    assert {"204", "403", "404", "409"} <= set(detail["delete"]["responses"])
    assert {p["name"] for p in schema["paths"]["/api/v1/sessions"]["get"]["parameters"]} >= {"agent", "erased", "cursor", "limit"}
