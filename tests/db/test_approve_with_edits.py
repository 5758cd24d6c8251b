"""Issue 18 item 3: an approver edits a pending call's arguments and approves (API, page, admin, one service)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts import services as tenant_services
from agents.services import start_run
from approvals.decisions import ApprovalRefused, decide
from approvals.edits import EditInvalid
from approvals.gate import ApprovalGate
from approvals.models import ApprovalRequest
from approvals.policy import render_preview
from audit.models import ConfigChange
from runtime.types import ToolCall, ToolContext, ToolStatus
from tenants.models import Role
from tenants.scoping import actor_for_api_key, actor_for_user
from tests.factories import World, make_user, make_world
from tools.arguments import arguments_hash
from tools.models import Tool, ToolCategory, ToolKind

pytestmark = pytest.mark.django_db

REASON = "parcel crushed, customer is upset"
SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^O\\d{12}$"},
        "amount": {"type": "string", "pattern": "^\\d+\\.\\d{2}$"},
        "reason": {"type": "string", "minLength": 3},
    },
    "required": ["order_id", "amount", "reason"],
    "additionalProperties": False,
}
ARGS = {"order_id": "O202411280001", "amount": "300.00", "reason": REASON}


def _tool(world: World, policy: dict[str, Any] | None = None) -> Tool:
    return Tool.objects.filter(tenant=world.tenant, name="refund_order").first() or Tool.objects.create(
        tenant=world.tenant, name="refund_order", kind=ToolKind.PYTHON, category=ToolCategory.WRITE,
        description="Refund an order.", parameters=SCHEMA, config={}, requires_approval=True,
        sensitive_fields=["reason"], approval_policy=policy or {},
    )


def _request(world: World, *, policy: dict[str, Any] | None = None, required: int = 1) -> ApprovalRequest:
    tool = _tool(world, policy)
    run = start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="refund order O202411280001")
    return ApprovalRequest.objects.create(
        tenant=world.tenant, run=run, step=1, call_id="call-1", tool=tool, tool_name=tool.name, arguments=ARGS,
        arguments_hash=arguments_hash(ARGS), preview=render_preview(tool, ARGS), required_approvals=required,
        expires_at=timezone.now() + timedelta(hours=1),
    )


def _approver(world: World) -> Any:
    user = make_user()
    tenant_services.set_membership(tenant=world.tenant, user=user, role=Role.APPROVER, actor=None)
    return user


def _api(world: World, user: Any) -> APIClient:
    _key, raw = tenant_services.create_api_key(tenant=world.tenant, name=f"k-{user.pk}", owner=user, role=Role.APPROVER, actor=None)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return api


def _gate(request: ApprovalRequest) -> Any:
    tool = Tool.objects.get(pk=request.tool_id)
    return ApprovalGate(request.run).gate(
        tool=tool, call=ToolCall("call-1", tool.name, json.dumps(ARGS)), ctx=ToolContext(str(request.run_id), 1, "s"),
        arguments=ARGS, args_hash=arguments_hash(ARGS))


def test_the_api_validates_edits_against_the_schema_naming_each_field() -> None:
    world = make_world()
    request = _request(world)
    api = _api(world, _approver(world))
    bad = api.post(f"/api/v1/approvals/{request.pk}/approve", {"arguments": {"amount": "thirty", "colour": "red"}}, format="json")
    assert bad.status_code == 400, bad.content
    problems = bad.json()["arguments"]
    assert any(p.startswith("arguments.amount: expected") and "thirty" in p for p in problems), problems
    assert any("colour" in p for p in problems), problems
    assert api.post(f"/api/v1/approvals/{request.pk}/approve", {"arguments": ["x"]}, format="json").status_code == 400
    rejected = api.post(f"/api/v1/approvals/{request.pk}/reject", {"arguments": {"amount": "30.00"}}, format="json")
    assert rejected.status_code == 400 and "only an approval" in json.dumps(rejected.json())
    request.refresh_from_db()
    assert request.status == "pending" and request.edited_arguments is None and not request.decisions.exists()


def test_an_edit_is_executed_exactly_as_approved_and_a_tampered_one_is_not() -> None:
    world = make_world()
    request = _request(world)
    approver = _approver(world)
    api = _api(world, approver)
    response = api.post(f"/api/v1/approvals/{request.pk}/approve",
                        {"arguments": {"amount": "30.00"}, "arguments_hash": request.arguments_hash}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    edited = {**ARGS, "amount": "30.00"}
    assert body["status"] == "approved" and body["edited_hash"] == arguments_hash(edited)
    assert body["preview"]["changes"] == [{"field": "amount", "old": "300.00", "new": "30.00"}]
    assert body["decisions"][0]["edited"] and body["decisions"][0]["arguments_hash"] == arguments_hash(edited)
    decision = _gate(request)
    assert decision.proceed and decision.arguments == edited and decision.args_hash == arguments_hash(edited)
    assert 'amount: "300.00" → "30.00"' in decision.message and "approver edited" in decision.message
    # tampering with the stored edit after the approval: the hash no longer matches, nothing runs
    ApprovalRequest.objects.filter(pk=request.pk).update(edited_arguments={**ARGS, "amount": "3000.00"})
    tampered = _gate(request)
    assert not tampered.proceed and tampered.status == ToolStatus.DENIED and tampered.arguments is None
    # and an edited hash swapped in to match the tampered arguments does not match what the approver approved
    ApprovalRequest.objects.filter(pk=request.pk).update(edited_hash=arguments_hash({**ARGS, "amount": "3000.00"}))
    assert not _gate(request).proceed


def test_both_versions_are_audited_and_sensitive_fields_masked_in_each() -> None:
    world = make_world()
    request = _request(world)
    approver = _approver(world)
    new_reason = "refund agreed on the phone 13812345678"
    decide(actor=actor_for_user(approver), request_id=request.pk, approve=True, arguments={"reason": new_reason, "amount": "30.00"})
    row = ConfigChange.objects.get(action="approval.approved", target_id=str(request.pk))
    details = row.details
    assert details["edited"] and details["original_arguments"]["amount"] == "300.00"
    assert details["edited_arguments"]["amount"] == "30.00"
    assert details["original_hash"] == arguments_hash(ARGS) and details["edited_hash"] == arguments_hash({**ARGS, "amount": "30.00",
                                                                                                          "reason": new_reason})
    dumped = json.dumps(details) + json.dumps(ApprovalRequest.objects.get(pk=request.pk).preview)
    assert REASON not in dumped and new_reason not in dumped and "13812345678" not in dumped
    assert {c["field"] for c in details["changes"]} == {"amount", "reason"}
    note = _gate(request).message
    assert "reason" in note and new_reason not in note and REASON not in note


def test_policy_can_forbid_edits_and_a_version_cannot_loosen_the_floor() -> None:
    world = make_world()
    request = _request(world, policy={"mode": "always", "allow_edits": False})
    approver = _approver(world)
    world.version.policy = {**(world.version.policy or {}), "approvals": {"tools": {"refund_order": {"mode": "always",
                                                                                                       "allow_edits": True}}}}
    world.version.save(update_fields=["policy"])
    with pytest.raises(ApprovalRefused) as refused:
        decide(actor=actor_for_user(approver), request_id=request.pk, approve=True, arguments={"amount": "30.00"})
    assert refused.value.status == 403 and "does not allow" in str(refused.value)
    api = _api(world, approver)
    assert api.post(f"/api/v1/approvals/{request.pk}/approve", {"arguments": {"amount": "30.00"}}, format="json").status_code == 403
    # approving as it stands still works
    assert decide(actor=actor_for_user(approver), request_id=request.pk, approve=True).status == "approved"


def test_a_version_entry_can_forbid_edits_the_tool_allows() -> None:
    world = make_world()
    request = _request(world)
    world.version.policy = {**(world.version.policy or {}), "approvals": {"tools": {"refund_order": {"mode": "always",
                                                                                                       "allow_edits": False}}}}
    world.version.save(update_fields=["policy"])
    with pytest.raises(ApprovalRefused):
        decide(actor=actor_for_user(_approver(world)), request_id=request.pk, approve=True, arguments={"amount": "30.00"})


def test_four_eyes_the_second_approver_approves_the_edited_version() -> None:
    world = make_world()
    request = _request(world, required=2)
    first, second = _approver(world), _approver(world)
    original_hash = request.arguments_hash
    decide(actor=actor_for_user(first), request_id=request.pk, approve=True, arguments={"amount": "30.00"}, seen_hash=original_hash)
    request.refresh_from_db()
    assert request.status == "pending" and request.current_hash != original_hash
    # the second approver's view of the original is stale: refused, nothing recorded
    with pytest.raises(ApprovalRefused) as stale:
        decide(actor=actor_for_user(second), request_id=request.pk, approve=True, seen_hash=original_hash)
    assert stale.value.status == 409 and "edited by another approver" in str(stale.value)
    # the second cannot edit what the first approved
    with pytest.raises(ApprovalRefused):
        decide(actor=actor_for_user(second), request_id=request.pk, approve=True, arguments={"amount": "20.00"})
    page = Client()
    page.force_login(second)
    html = page.get(f"/approvals/{request.pk}/").content.decode()
    assert 'data-edited="amount" class="changed"' in html and "300.00" in html and "30.00" in html
    assert "Approve with edits" not in html  # only the first approver may edit
    inbox = page.get("/approvals/").content.decode()
    assert 'amount: 300.00 → 30.00 (edited)' in inbox and f'name="arguments_hash" value="{request.current_hash}"' in inbox
    done = decide(actor=actor_for_user(second), request_id=request.pk, approve=True, seen_hash=request.current_hash)
    assert done.status == "approved"
    assert set(done.decisions.values_list("arguments_hash", flat=True)) == {request.edited_hash}
    assert _gate(request).arguments == {**ARGS, "amount": "30.00"}


def test_an_edit_that_the_rule_sends_to_two_people_needs_a_second_approver() -> None:
    world = make_world()
    request = _request(world, policy={"mode": "condition", "condition": {"field": "order_id", "op": "==", "value": "O202411280001"},
                                      "four_eyes": True})
    ApprovalRequest.objects.filter(pk=request.pk).update(required_approvals=1)
    first = _approver(world)
    decided = decide(actor=actor_for_user(first), request_id=request.pk, approve=True, arguments={"amount": "30.00"})
    assert decided.status == "pending" and decided.required_approvals == 2


def test_no_self_approval_with_edits_and_a_foreign_tenant_gets_404() -> None:
    world, other = make_world(), make_world()
    request = _request(world)
    with pytest.raises(ApprovalRefused) as own:
        decide(actor=actor_for_user(world.operator), request_id=request.pk, approve=True, arguments={"amount": "30.00"})
    assert own.value.status in (403,)
    foreign = _api(other, _approver(other))
    assert foreign.post(f"/api/v1/approvals/{request.pk}/approve", {"arguments": {"amount": "30.00"}}, format="json").status_code == 404
    page = Client()
    page.force_login(_approver(other))
    assert page.post(f"/approvals/{request.pk}/decide", {"decision": "approve", "edit": "1", "arg:amount": "1.00"}).status_code == 404
    request.refresh_from_db()
    assert request.edited_arguments is None and request.status == "pending"


def test_the_page_re_renders_the_form_with_the_error_then_approves_the_edit() -> None:
    world = make_world()
    request = _request(world)
    approver = _approver(world)
    page = Client(enforce_csrf_checks=True)
    page.force_login(approver)
    url = f"/approvals/{request.pk}/"
    html = page.get(url).content.decode()
    assert 'name="arg:amount" value="300.00"' in html and 'name="arg:reason" value=""' in html  # masked: not prefilled
    token = page.cookies["csrftoken"].value
    form = {"csrfmiddlewaretoken": token, "decision": "approve", "edit": "1", "arguments_hash": request.arguments_hash,
            "arg:order_id": ARGS["order_id"], "arg:reason": "", "next": url}
    bad = page.post(f"{url}decide", {**form, "arg:amount": "thirty"})
    assert bad.status_code == 400 and "arguments.amount: expected" in bad.content.decode()
    assert 'value="thirty"' in bad.content.decode()
    assert page.post(f"{url}decide", {k: v for k, v in form.items() if k != "csrfmiddlewaretoken"}).status_code == 403  # CSRF
    ok = page.post(f"{url}decide", {**form, "arg:amount": "30.00"})
    assert ok.status_code == 302
    request.refresh_from_db()
    assert request.status == "approved" and request.edited_arguments == {**ARGS, "amount": "30.00"}  # reason kept
    assert 'class="changed"' in page.get(url).content.decode()


def test_an_unchanged_edit_is_a_plain_approval() -> None:
    world = make_world()
    request = _request(world)
    decided = decide(actor=actor_for_user(_approver(world)), request_id=request.pk, approve=True, arguments={"amount": "300.00"})
    assert decided.status == "approved" and decided.edited_arguments is None
    assert _gate(request).proceed and _gate(request).arguments is None


def test_edit_invalid_is_a_400_domain_error() -> None:
    assert EditInvalid(["arguments.x: expected y, got z"]).status == 400


def test_the_admin_approves_with_edits_through_the_same_service() -> None:
    world, other = make_world(), make_world()
    request = _request(world)
    approver = _approver(world)
    approver.is_staff = True
    approver.save(update_fields=["is_staff"])
    admin = Client(enforce_csrf_checks=True)
    admin.force_login(approver)
    url = f"/admin/approvals/approvalrequest/{request.pk}/approve-with-edits/"
    page = admin.get(url)
    assert page.status_code == 200 and "300.00" in page.content.decode() and REASON not in page.content.decode()
    token = admin.cookies["csrftoken"].value
    bad = admin.post(url, {"csrfmiddlewaretoken": token, "arguments": '{"amount": "thirty"}', "arguments_hash": request.arguments_hash})
    assert bad.status_code == 400 and "arguments.amount: expected" in bad.content.decode()
    outsider = make_user(is_staff=True)
    tenant_services.set_membership(tenant=other.tenant, user=outsider, role=Role.APPROVER, actor=None)
    foreign = Client()
    foreign.force_login(outsider)
    assert foreign.get(url).status_code == 404
    assert foreign.post(url, {"arguments": '{"amount": "1.00"}'}).status_code == 404
    ok = admin.post(url, {"csrfmiddlewaretoken": token, "arguments": '{"amount": "30.00"}', "note": "only the tea",
                          "arguments_hash": request.arguments_hash})
    assert ok.status_code == 302, ok.content.decode()[:2000]
    request.refresh_from_db()
    assert request.status == "approved" and request.edited_arguments == {**ARGS, "amount": "30.00"}
    assert request.decisions.get().via == "admin"
