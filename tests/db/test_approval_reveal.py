"""Issue 17 item 2: the approver's page shows time left as a person reads it, links the run's trace, and lets an
approver holding the permission reveal a field the tool masks (audited); the trace says who decided and with what note."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from accounts import services as tenant_services
from agents.services import start_run
from approvals.decisions import decide
from approvals.gate import decision_trace
from approvals.models import ApprovalRequest
from approvals.policy import render_preview
from approvals.timeleft import humanize_seconds
from audit.models import ConfigChange
from tenants.models import Role
from tenants.scoping import actor_for_api_key, actor_for_user
from tests.factories import World, csrf_client, make_user, make_world
from tools.models import Tool, ToolCategory, ToolKind

pytestmark = pytest.mark.django_db

REASON = "parcel crushed, call 13812345678 about it"


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (45, "45 s"), (59, "59 s"), (60, "1 min"), (3532, "58 min"), (3600, "1 h"), (3900, "1 h 5 min"),
    (86_400, "1 d"), (97_200, "1 d 3 h"), (-5, "0 s"), (None, "0 s"),
])
def test_time_left_reads_as_a_person_would_say_it(seconds: Any, text: str) -> None:
    assert humanize_seconds(seconds) == text


def _refund_tool(world: World) -> Tool:
    return Tool.objects.create(
        tenant=world.tenant, name="refund_order", kind=ToolKind.PYTHON, category=ToolCategory.WRITE,
        description="Refund an order.", parameters={"type": "object"}, config={}, requires_approval=True,
        sensitive_fields=["reason"],
    )


def _request(world: World, *, minutes: float = 58.9) -> ApprovalRequest:
    tool = Tool.objects.filter(tenant=world.tenant, name="refund_order").first() or _refund_tool(world)
    run = start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="refund order O202411280001")
    arguments = {"order_id": "O202411280001", "reason": REASON, "api_token": "tok-secret-value-123"}
    return ApprovalRequest.objects.create(
        tenant=world.tenant, run=run, step=1, call_id="call-1", tool=tool, tool_name=tool.name, arguments=arguments,
        arguments_hash="0" * 64, preview=render_preview(tool, arguments), expires_at=timezone.now() + timedelta(minutes=minutes),
    )


def _approver(world: World, *, may_reveal: bool) -> Any:
    user = make_user()
    tenant_services.set_membership(tenant=world.tenant, user=user, role=Role.APPROVER, actor=None)
    if may_reveal:
        user.user_permissions.add(Permission.objects.get(codename="reveal_sensitive_fields", content_type__app_label="approvals"))
    return user


def _csrf(client: Client, url: str) -> str:
    client.get(url)
    return client.cookies["csrftoken"].value


def _reveals() -> Any:
    return ConfigChange.objects.filter(action="approval.field_revealed")


def test_the_page_and_the_list_show_time_left_humanized_and_link_the_trace() -> None:
    world = make_world()
    request = _request(world)
    client = csrf_client(_approver(world, may_reveal=False))
    page = client.get(f"/approvals/{request.pk}/").content.decode()
    assert "58 min</span> left" in page and "3532 s left" not in page
    assert f'href="/console/runs/{request.run_id}/"' in page
    listing = client.get("/approvals/?fragment=1").content.decode()
    assert ">58 min</td>" in listing and 'class="trace-link"' in listing and f"/console/runs/{request.run_id}/" in listing
    # the trace it links to opens for the approver
    assert client.get(f"/console/runs/{request.run_id}/").status_code == 200


def test_a_permitted_approver_reveals_a_masked_field_and_it_is_audited(caplog: pytest.LogCaptureFixture) -> None:
    world = make_world()
    request = _request(world)
    approver = _approver(world, may_reveal=True)
    client = csrf_client(approver)
    url = f"/approvals/{request.pk}/"
    page = client.get(url).content.decode()
    assert REASON not in page and "13812345678" not in page, "masked until revealed"
    assert 'name="field" value="reason"' in page
    assert 'value="api_token"' not in page, "a secret by name is never offered"

    caplog.set_level(logging.DEBUG)
    revealed = client.post(f"{url}reveal", {"field": "reason", "csrfmiddlewaretoken": _csrf(client, url)})
    assert revealed.status_code == 200 and REASON in revealed.content.decode()
    assert "no-store" in revealed["Cache-Control"]
    row = _reveals().get()
    assert row.actor == approver and row.tenant == world.tenant and row.target_id == str(request.pk)
    assert row.details["field"] == "reason" and REASON not in str(row.details) and row.created_at is not None
    assert REASON not in caplog.text and "13812345678" not in caplog.text
    # a secret by name and an unknown field are refused with a reason, and not audited
    for field in ("api_token", "amount", ""):
        refused = client.post(f"{url}reveal", {"field": field, "csrfmiddlewaretoken": _csrf(client, url)})
        assert refused.status_code == 400 and "revealable here: reason" in refused.content.decode()
        assert "tok-secret-value-123" not in refused.content.decode()
    assert _reveals().count() == 1


def test_without_the_permission_there_is_no_button_and_the_endpoint_refuses() -> None:
    world = make_world()
    request = _request(world)
    url = f"/approvals/{request.pk}/"
    for user in (_approver(world, may_reveal=False), world.viewer):
        client = csrf_client(user)
        page = client.get(url)
        if user is world.viewer:
            assert page.status_code == 404, "a viewer does not review approvals"
            continue
        assert 'class="reveal"' not in page.content.decode()
        refused = client.post(f"{url}reveal", {"field": "reason", "csrfmiddlewaretoken": _csrf(client, url)})
        assert refused.status_code == 403 and REASON not in refused.content.decode()
    # the permission does not stand in for a deciding role: an operator holding it is refused too
    operator = world.operator
    operator.user_permissions.add(Permission.objects.get(codename="reveal_sensitive_fields"))
    client = csrf_client(operator)
    assert client.post(f"{url}reveal", {"field": "reason", "csrfmiddlewaretoken": _csrf(client, url)}).status_code == 403
    assert not _reveals().exists()


def test_a_foreign_tenants_request_is_not_found_even_with_the_permission() -> None:
    mine, theirs = make_world(), make_world()
    foreign = _request(theirs)
    client = csrf_client(_approver(mine, may_reveal=True))
    token = _csrf(client, "/approvals/")
    assert client.get(f"/approvals/{foreign.pk}/").status_code == 404
    response = client.post(f"/approvals/{foreign.pk}/reveal", {"field": "reason", "csrfmiddlewaretoken": token})
    assert response.status_code == 404 and REASON not in response.content.decode()
    assert not _reveals().exists()


def test_reveal_needs_the_csrf_token() -> None:
    world = make_world()
    request = _request(world)
    client = csrf_client(_approver(world, may_reveal=True))
    response = client.post(f"/approvals/{request.pk}/reveal", {"field": "reason"})
    assert response.status_code == 403 and REASON not in response.content.decode()
    assert not _reveals().exists()
    assert client.get(f"/approvals/{request.pk}/reveal").status_code == 405


def test_the_trace_says_who_decided_and_with_what_note_masked() -> None:
    world = make_world()
    request = _request(world)
    approver = _approver(world, may_reveal=False)
    decide(actor=actor_for_user(approver), request_id=request.pk, approve=False, note="no: customer at 13812345678")
    request = ApprovalRequest.objects.prefetch_related("decisions__user").get(pk=request.pk)
    trace = decision_trace(request)
    assert trace["decided_by"] == approver.get_username()
    assert "13812345678" not in trace["decision_note"] and trace["decision_note"].startswith("no: customer at")
    assert trace["decisions"][0]["approved"] is False and trace["decisions"][0]["via"] == "page"


def test_the_decision_reaches_the_runs_trace_events_and_the_api() -> None:
    from rest_framework.test import APIClient

    from agents import services
    from agents.models import RunEvent
    from approvals.decisions import resume_run

    world = make_world()
    Tool.objects.filter(tenant=world.tenant, name="query_order").update(requires_approval=True)
    run = start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="What is the status of order O202411280001?")
    services.execute_run(str(run.pk))
    request = ApprovalRequest.objects.get(run=run)
    approver = _approver(world, may_reveal=False)
    decide(actor=actor_for_user(approver), request_id=request.pk, approve=True, note="ok, customer called from 13812345678")
    assert resume_run(run.pk)
    services.execute_run(str(run.pk))

    stage = next(e.payload for e in RunEvent.objects.filter(run=run, type="tool.stage").order_by("seq")
                 if e.payload.get("stage") == "approval" and e.payload.get("approval_status") == "approved")
    assert stage["decided_by"] == approver.get_username() and stage["approval_id"] == str(request.pk)
    assert stage["decision_note"].startswith("ok, customer called from") and "13812345678" not in stage["decision_note"]
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    events = api.get(f"/api/v1/runs/{run.pk}/events")
    assert events.status_code == 200, events.content
    text = events.content.decode()
    assert f'"decided_by":"{approver.get_username()}"' in text.replace(": ", ":") and "13812345678" not in text
