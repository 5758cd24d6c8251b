"""Approval notifications: channel validation through one service (API and admin), signatures, masking, retries."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts import services as tenant_services
from agents.services import start_run
from approvals import notify, tasks
from approvals.channels import KEEP, create_channel
from approvals.models import ApprovalRequest, Delivery, DeliveryStatus, NotificationChannel
from audit.models import ConfigChange
from tenants.models import Role
from tenants.scoping import actor_for_api_key, actor_for_user
from tests.factories import World, make_user, make_world
from tests.support.clients import bearer_client
from tests.support.recording_sink import RecordingSink
from tools.models import Tool, ToolCategory, ToolKind

pytestmark = pytest.mark.django_db

SIGNING_SECRET = "whsec-test-0123456789abcdef-never-shown"


@pytest.fixture(autouse=True)
def deployment(settings: Any) -> None:
    settings.TOOL_EGRESS_ALLOW = ["127.0.0.1"]  # the sink listens on loopback, as for tools' local servers
    settings.NOTIFY_SECRETS = {"HOOKS": SIGNING_SECRET}
    settings.PUBLIC_BASE_URL = "https://console.example.test"
    settings.NOTIFY_RETRY_BASE_SECONDS = 10.0
    settings.NOTIFY_MAX_ATTEMPTS = 3


@pytest.fixture
def world(db: Any) -> World:
    world = make_world()
    world.tenant.settings = {**world.tenant.settings, "notify_secrets": ["HOOKS"]}
    world.tenant.save(update_fields=["settings"])
    return world


@pytest.fixture
def outsider(db: Any) -> World:
    return make_world()


def _refund_tool(world: World) -> Tool:
    return Tool.objects.create(
        tenant=world.tenant, name="refund_order", kind=ToolKind.PYTHON, category=ToolCategory.WRITE, requires_approval=True,
        parameters={"type": "object", "properties": {}}, sensitive_fields=["reason"],
    )


def _request(world: World, tool: Tool, *, minutes: int = 30, **arguments: Any) -> ApprovalRequest:
    run = start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="refund order O202411280001")
    return ApprovalRequest.objects.create(
        tenant=world.tenant, run=run, step=1, call_id="call-1", tool=tool, tool_name=tool.name,
        arguments={"order_id": "O202411280001", **arguments}, arguments_hash="0" * 64,
        expires_at=timezone.now() + timedelta(minutes=minutes),
    )


def _api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _webhook(client: APIClient, **body: Any) -> Any:
    payload = {"name": "hook", "kind": "webhook_json", "target": "https://hooks.example.com/approvals",
               "events": ["arrived"], "secret": "secret:HOOKS", **body}
    return client.post("/api/v1/notification-channels", payload, format="json")


def _channel(world: World, sink: RecordingSink | None = None, **values: Any) -> NotificationChannel:
    target = f"http://127.0.0.1:{sink.port}/hook" if sink else ""
    values = {"name": "hook", "kind": "webhook_json", "target": target, "events": ["arrived", "expiring"], **values}
    secret = "secret:HOOKS" if values["kind"] == "webhook_json" else KEEP
    tools = values.pop("tools", KEEP)
    return create_channel(actor=actor_for_user(world.operator), tenant=world.tenant, values=values, secret=secret, tools=tools)


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"target": "not a url"}, "target", "http or https URL"),
    ({"target": "ftp://hooks.example.com/x"}, "target", "http or https URL"),
    ({"target": "http://10.0.0.5/hook"}, "target", "private"),
    ({"target": "http://169.254.169.254/latest/meta-data"}, "target", "link-local"),
    ({"target": "http://localhost:8080/x"}, "target", "loopback"),
    ({"target": "https://user:pw@hooks.example.com/x"}, "target", "user name or password"),
    ({"events": ["decided"]}, "events", "arrived"),
    ({"secret": "whsec-raw-value"}, "secret", "secret:NAME"),
    ({"secret": "secret:OTHER"}, "secret", "not available to this tenant"),
    ({"secret": ""}, "secret", "signed"),
    ({"kind": "email", "secret": "", "target": "https://hooks.example.com/x"}, "target", "leave the target empty"),
])
def test_a_bad_channel_is_a_400_naming_the_field_and_saves_nothing(world: World, settings: Any, body: dict[str, Any],
                                                                   field: str, words: str) -> None:
    settings.TOOL_EGRESS_ALLOW = []
    response = _webhook(_api(world), **body)
    assert response.status_code == 400, response.content
    assert field in response.json() and words in json.dumps(response.json()), response.json()
    assert not NotificationChannel.objects.exists()
    assert not ConfigChange.objects.filter(action__startswith="notification_channel").exists()


def test_a_loopback_sink_is_allowed_only_by_the_deployment_allow_list(world: World, settings: Any) -> None:
    settings.TOOL_EGRESS_ALLOW = []
    assert _webhook(_api(world), target="http://127.0.0.1:9/hook").status_code == 400
    settings.TOOL_EGRESS_ALLOW = ["127.0.0.1"]
    assert _webhook(_api(world), target="http://127.0.0.1:9/hook").status_code == 201


def test_a_foreign_tenants_tool_in_the_filter_is_refused(world: World, outsider: World) -> None:
    foreign = _refund_tool(outsider)
    response = _webhook(_api(world), tools=[foreign.name])
    assert response.status_code == 400
    assert "no tool named refund_order" in response.json()["tools"][0]
    mine = _refund_tool(world)
    created = _webhook(_api(world), tools=[mine.name]).json()
    assert created["tools"] == ["refund_order"]
    assert list(NotificationChannel.objects.get(pk=created["id"]).tools.all()) == [mine]


def test_another_tenant_cannot_see_or_change_the_channel(world: World, outsider: World) -> None:
    created = _webhook(_api(world)).json()
    for method in ("get", "patch", "delete"):
        response = getattr(_api(outsider), method)(f"/api/v1/notification-channels/{created['id']}", {"enabled": False},
                                                  format="json")
        assert response.status_code == 404, (method, response.content)
    assert _api(outsider).get("/api/v1/notification-channels").json()["results"] == []
    assert NotificationChannel.objects.get(pk=created["id"]).enabled


def test_a_viewer_may_not_add_a_channel(world: World) -> None:
    _key, raw = tenant_services.create_api_key(tenant=world.tenant, name="v", owner=world.viewer, role=Role.VIEWER, actor=None)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert _webhook(client).status_code == 403


def test_the_secret_is_never_shown_back_nor_audited(world: World) -> None:
    client = _api(world)
    created = client.post("/api/v1/notification-channels", {
        "name": "hook", "kind": "webhook_json", "target": "https://hooks.example.com/approvals",
        "events": ["arrived"], "secret": "secret:HOOKS"}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert "secret" not in body and body["secret_status"] == "set"
    changed = client.patch(f"/api/v1/notification-channels/{body['id']}", {"events": ["arrived", "expiring"]}, format="json")
    assert changed.status_code == 200 and changed.json()["secret_status"] == "set"  # kept when not given
    rows = ConfigChange.objects.filter(action__startswith="notification_channel").order_by("pk")
    assert [r.action for r in rows] == ["notification_channel.create", "notification_channel.update"]
    assert rows[0].details["secret"] == "set" and rows[0].details["target_host"] == "hooks.example.com"
    audited = json.dumps([r.details for r in rows])
    seen = audited + json.dumps(body) + json.dumps(changed.json())
    assert "HOOKS" not in seen and SIGNING_SECRET not in seen
    assert "/approvals" not in audited  # of the URL (a Slack URL is a credential) the audit keeps the host only


def test_the_admin_saves_through_the_service_and_refuses_what_the_api_refuses(world: World, settings: Any) -> None:
    settings.TOOL_EGRESS_ALLOW = []
    owner = make_user(is_staff=True)
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    client = Client()
    client.force_login(owner)
    form = {"tenant": world.tenant.pk, "name": "ops", "kind": "webhook_slack", "target": "http://10.1.2.3/hook",
            "events": ["arrived"], "enabled": "on"}
    refused = client.post("/admin/approvals/notificationchannel/add/", form)
    assert refused.status_code == 200 and b"private" in refused.content
    assert not NotificationChannel.objects.exists()
    saved = client.post("/admin/approvals/notificationchannel/add/", {**form, "target": "https://hooks.example.com/T/B/x"})
    assert saved.status_code == 302, saved.content[:3000]
    assert ConfigChange.objects.filter(action="notification_channel.create", actor=owner).exists()
    listing = client.get("/admin/approvals/notificationchannel/")
    assert b"hooks.example.com" in listing.content and b"/T/B/x" not in listing.content


# -- bodies ----------------------------------------------------------------------------------------


def test_sign_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"event":"approval.arrived"}'
    expected = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert notify.sign("k", "1700000000", body) == f"v1={expected}"
    assert notify.sign("k", "1700000001", body) != notify.sign("k", "1700000000", body)  # the timestamp is signed too


def test_a_webhook_is_signed_deep_links_and_masks_sensitive_values(world: World) -> None:
    tool = _refund_tool(world)
    request = _request(world, tool, reason="customer is 13812345678, card 4111 1111 1111 1111", password="hunter2")
    with RecordingSink(status=204, body="") as sink:
        channel = _channel(world, sink)
        [delivery_id] = notify.fan_out(request.pk, "arrived")
        assert notify.attempt(delivery_id) is None
    [(method, path, headers, raw)] = sink.requests
    assert (method, path) == ("POST", "/hook")
    lowered = {k.lower(): v for k, v in headers.items()}
    assert lowered["x-agentops-signature"] == notify.sign(SIGNING_SECRET, lowered["x-agentops-timestamp"], raw.encode())
    assert abs(int(lowered["x-agentops-timestamp"]) - timezone.now().timestamp()) < 60
    body = json.loads(raw)
    assert body["event"] == "approval.arrived"
    assert body["url"] == f"https://console.example.test/approvals/{request.pk}/"
    arguments = body["approval"]["arguments"]
    assert arguments["order_id"] == "O202411280001"
    assert "13812345678" not in raw and "4111 1111 1111 1111" not in raw and "hunter2" not in raw
    assert arguments["reason"] != request.arguments["reason"] and arguments["password"] != "hunter2"
    assert SIGNING_SECRET not in raw
    delivery = Delivery.objects.get(pk=delivery_id)
    assert (delivery.status, delivery.attempts, delivery.response_code, delivery.channel) == ("sent", 1, 204, channel)


def test_a_slack_body_has_text_a_button_to_the_request_and_masked_arguments(world: World) -> None:
    request = _request(world, _refund_tool(world), reason="secret story of 13812345678")
    with RecordingSink(status=200, body="ok") as sink:
        _channel(world, sink, kind="webhook_slack", name="slack")
        [delivery_id] = notify.fan_out(request.pk, "arrived")
        notify.attempt(delivery_id)
    body = json.loads(sink.requests[0][3])
    url = f"https://console.example.test/approvals/{request.pk}/"
    assert url in body["text"] and "refund_order" in body["text"]
    assert body["blocks"][-1]["elements"][0]["url"] == url
    assert "13812345678" not in sink.requests[0][3] and "secret story" not in sink.requests[0][3]
    assert "x-agentops-signature" not in {k.lower() for k in sink.requests[0][2]}  # no secret given: Slack's URL is its own


def test_email_goes_to_the_members_who_may_approve_with_the_link(world: World) -> None:
    approver = make_user(email="ann@example.test")
    tenant_services.set_membership(tenant=world.tenant, user=approver, role=Role.APPROVER, actor=None)
    world.viewer.email = "viewer@example.test"
    world.viewer.save(update_fields=["email"])
    request = _request(world, _refund_tool(world), reason="private reason text")
    _channel(world, kind="email", name="mail")
    [delivery_id] = notify.fan_out(request.pk, "arrived")
    assert notify.attempt(delivery_id) is None
    [message] = mail.outbox
    assert message.to == ["ann@example.test"]
    assert f"https://console.example.test/approvals/{request.pk}/" in message.body
    assert "refund_order" in message.subject and "private reason text" not in message.body


def test_a_channel_filtered_to_other_tools_and_a_disabled_one_get_nothing(world: World) -> None:
    refund = _refund_tool(world)
    other = Tool.objects.filter(tenant=world.tenant).exclude(pk=refund.pk).first()
    _channel(world, name="other-tool", kind="email", tools=[other.name])
    create_channel(actor=actor_for_user(world.operator), tenant=world.tenant,
                   values={"name": "off", "kind": "email", "events": ["arrived"], "enabled": False})
    wanted = _channel(world, name="refunds", kind="email", tools=[refund.name])
    request = _request(world, refund)
    ids = notify.fan_out(request.pk, "arrived")
    assert [Delivery.objects.get(pk=i).channel for i in ids] == [wanted]
    assert notify.fan_out(request.pk, "arrived") == ids  # idempotent: the same rows, none added
    assert Delivery.objects.count() == 1


# -- retries ---------------------------------------------------------------------------------------


def test_a_failed_webhook_is_retried_with_exponential_backoff_then_given_up(world: World, caplog: Any) -> None:
    request = _request(world, _refund_tool(world))
    with RecordingSink(status=500, body="sink down") as sink:
        _channel(world, sink)
        [delivery_id] = notify.fan_out(request.pk, "arrived")
        with caplog.at_level(logging.WARNING):
            delays = [notify.attempt(delivery_id) for _ in range(3)]
        assert notify.attempt(delivery_id) is None  # given up: no fourth try
    assert delays == [10.0, 20.0, None]
    assert len(sink.requests) == 3
    delivery = Delivery.objects.get(pk=delivery_id)
    assert (delivery.status, delivery.attempts, delivery.response_code) == (DeliveryStatus.FAILED, 3, 500)
    assert "HTTP 500" in delivery.last_error and "sink down" not in delivery.last_error  # the body is never kept
    assert SIGNING_SECRET not in caplog.text


def test_a_retry_succeeds_after_a_500_and_records_the_state_between(world: World) -> None:
    request = _request(world, _refund_tool(world))
    with RecordingSink(status=500, body="try later") as sink:
        _channel(world, sink)
        [delivery_id] = notify.fan_out(request.pk, "arrived")
        assert notify.attempt(delivery_id) == 10.0
        waiting = Delivery.objects.get(pk=delivery_id)
        assert waiting.status == DeliveryStatus.RETRYING and waiting.response_code == 500
        assert 9 <= (waiting.next_attempt_at - timezone.now()).total_seconds() <= 10
        sink.status = 200
        assert notify.attempt(delivery_id) is None
    sent = Delivery.objects.get(pk=delivery_id)
    assert (sent.status, sent.attempts, sent.response_code, sent.last_error, sent.next_attempt_at) == ("sent", 2, 200, "", None)
    first, second = (json.loads(r[3]) for r in sink.requests)
    assert first == second  # the same notice, signed afresh


def test_an_unreachable_target_names_the_host_only(world: World) -> None:
    request = _request(world, _refund_tool(world))
    with RecordingSink() as sink:
        port = sink.port
    channel = _channel(world, name="gone", kind="webhook_slack", target="http://127.0.0.1:9/")
    NotificationChannel.objects.filter(pk=channel.pk).update(target=f"http://127.0.0.1:{port}/T000/B000/tokenpart")
    [delivery_id] = notify.fan_out(request.pk, "arrived")
    assert notify.attempt(delivery_id) == 10.0
    error = Delivery.objects.get(pk=delivery_id).last_error
    assert "127.0.0.1" in error and "tokenpart" not in error


def test_a_request_decided_before_its_notice_is_skipped(world: World) -> None:
    request = _request(world, _refund_tool(world))
    _channel(world, kind="email", name="mail")
    [delivery_id] = notify.fan_out(request.pk, "arrived")
    ApprovalRequest.objects.filter(pk=request.pk).update(status="approved")
    assert notify.attempt(delivery_id) is None
    assert Delivery.objects.get(pk=delivery_id).status == DeliveryStatus.SKIPPED and not mail.outbox


# -- expiry notices ----------------------------------------------------------------------------------


def test_the_sweep_announces_requests_expiring_within_the_lead_time_once(world: World, settings: Any,
                                                                        django_assert_max_num_queries: Any) -> None:
    settings.APPROVAL_EXPIRY_NOTICE_SECONDS = 600
    tool = _refund_tool(world)
    soon = [_request(world, tool, minutes=5) for _ in range(4)]
    later = _request(world, tool, minutes=60)
    with django_assert_max_num_queries(4):  # a select and an update (in a savepoint here), however many are due
        due = notify.expiry_notices_due()
    assert sorted(map(str, due)) == sorted(str(r.pk) for r in soon)
    assert notify.expiry_notices_due() == []  # claimed: a second sweep announces nothing again
    assert not ApprovalRequest.objects.get(pk=later.pk).expiry_noticed


def test_the_expiry_task_sends_the_expiring_notice(world: World, settings: Any, monkeypatch: Any,
                                                  django_capture_on_commit_callbacks: Any) -> None:
    settings.APPROVAL_EXPIRY_NOTICE_SECONDS = 600
    approver = make_user(email="ann@example.test")
    tenant_services.set_membership(tenant=world.tenant, user=approver, role=Role.APPROVER, actor=None)
    request = _request(world, _refund_tool(world), minutes=5)
    _channel(world, kind="email", name="mail", events=["expiring"])
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.notify_task, "delay", lambda *args: sent.append(args))  # the broker: what was enqueued
    with django_capture_on_commit_callbacks(execute=True):
        tasks.expire_approvals_task()
    assert sent == [(str(request.pk), "expiring")]
    [delivery_id] = notify.fan_out(*sent[0])
    notify.attempt(delivery_id)
    assert "expires soon" in mail.outbox[0].subject


def test_a_delivery_whose_task_was_lost_is_sent_again_by_the_sweep(world: World, monkeypatch: Any) -> None:
    request = _request(world, _refund_tool(world))
    _channel(world, kind="email", name="mail")
    [delivery_id] = notify.fan_out(request.pk, "arrived")
    assert notify.stranded_deliveries() == []  # just made: its task is on its way
    Delivery.objects.filter(pk=delivery_id).update(created_at=timezone.now() - timedelta(minutes=5))
    sent: list[Any] = []
    monkeypatch.setattr(tasks.deliver_task, "delay", sent.append)
    tasks.expire_approvals_task()
    assert sent == [delivery_id]
    Delivery.objects.filter(pk=delivery_id).update(status=DeliveryStatus.RETRYING,
                                                   next_attempt_at=timezone.now() + timedelta(minutes=30))
    assert notify.stranded_deliveries() == []  # waiting for its backoff is not lost


def test_how_long_a_delivery_waits_before_it_is_taken_as_lost_is_a_setting(world: World, settings: Any) -> None:
    request = _request(world, _refund_tool(world))
    _channel(world, kind="email", name="mail")
    [delivery_id] = notify.fan_out(request.pk, "arrived")
    Delivery.objects.filter(pk=delivery_id).update(created_at=timezone.now() - timedelta(seconds=40))
    assert settings.NOTIFY_RESEND_AFTER_SECONDS == 120 and notify.stranded_deliveries() == []
    settings.NOTIFY_RESEND_AFTER_SECONDS = 30
    assert notify.stranded_deliveries() == [delivery_id]


# -- issue #49: what a receiver says, what Slack renders, who reads a channel's URL ------------------------------


def test_a_failed_delivery_keeps_the_status_and_a_generic_reason_never_the_receivers_body(world: World) -> None:
    request = _request(world, _refund_tool(world))
    echoed = "invalid_token: hooks.slack.com/services/T0/B0/XXXXsecretpart <script>alert(1)</script>"
    with RecordingSink(status=403, body=echoed) as sink:
        _channel(world, sink)
        [delivery_id] = notify.fan_out(request.pk, "arrived")
        assert notify.attempt(delivery_id) == 10.0
    error = Delivery.objects.get(pk=delivery_id).last_error
    assert error == "127.0.0.1 answered HTTP 403 (Forbidden); its answer is not kept", error
    for part in ("invalid_token", "secretpart", "<script>"):
        assert part not in error
    owner = make_user(is_staff=True)
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    client = Client()
    client.force_login(owner)
    for page in ("/admin/approvals/delivery/", f"/admin/approvals/delivery/{delivery_id}/change/"):
        shown = client.get(page)
        assert shown.status_code == 200 and b"HTTP 403 (Forbidden)" in shown.content and b"secretpart" not in shown.content


def test_a_status_no_reason_phrase_exists_for_is_still_named() -> None:
    assert notify.failure_reason("hooks.example.com", 599) == "hooks.example.com answered HTTP 599; its answer is not kept"


def test_argument_text_cannot_leave_slacks_code_block_nor_mention_or_link(world: World) -> None:
    hostile = "x```\n<!channel> <https://evil.example/login|Re-enter your password> & <@U123>\n```*done*"
    request = _request(world, _refund_tool(world), note=hostile)
    body = notify.slack_body(notify.facts(request, "arrived"))
    code = body["blocks"][1]["text"]["text"]
    assert code.startswith("```") and code.endswith("```")
    inner = code[3:-3]
    assert "`" not in inner and "<" not in inner and ">" not in inner
    assert "&lt;!channel&gt;" in inner and "&lt;https://evil.example/login|" in inner and " &amp; " in inner
    everything = json.dumps(body)
    assert "<!channel>" not in everything and "<https://evil" not in everything and "<@U123>" not in everything


def test_slacks_code_block_stays_within_its_limit_and_never_ends_inside_an_escape(world: World) -> None:
    request = _request(world, _refund_tool(world), note="<&>" * 2000)
    code = notify.slack_body(notify.facts(request, "arrived"))["blocks"][1]["text"]["text"]
    assert len(code) <= 3000  # Slack refuses a section's text past 3,000 characters
    assert code.startswith("```") and code.endswith("```") and len(code) > 2500
    assert re.fullmatch(r"(?:[^&<>`]|&(?:lt|gt|amp);)*", code[3:-3]), code[-20:]  # cut between escapes, never in one


def test_slack_text_escapes_the_headline_too() -> None:
    data = {"event": "approval.arrived", "tool": "refund<!here>", "agent": "a&b", "tenant": "t", "run": "r",
            "arguments": {}, "expires_in_seconds": 600, "url": "https://console.example.test/approvals/1/"}
    body = notify.slack_body(data)
    assert "<!here>" not in json.dumps(body) and "refund&lt;!here&gt; for a&amp;b" in body["text"]


SLACK_URL = "https://hooks.slack.com/services/T0000/B0000/abcdefghijklmnopWXYZ"


def _key_client(world: World, role: str) -> APIClient:
    person = make_user(email=f"{role}@example.test")
    tenant_services.set_membership(tenant=world.tenant, user=person, role=role, actor=None)
    _key, raw = tenant_services.create_api_key(tenant=world.tenant, name=role, owner=person, role=role, actor=None)
    return bearer_client(raw)


def test_a_channels_url_is_read_back_masked_by_every_role(world: World) -> None:
    created = _webhook(_api(world), kind="webhook_slack", name="slack", target=SLACK_URL, secret="")
    assert created.status_code == 201, created.content
    assert created.json()["target"] == "https://hooks.slack.com/…WXYZ"
    for role in (Role.OWNER, Role.OPERATOR, Role.APPROVER, Role.VIEWER):
        client = _key_client(world, role)
        listed = client.get("/api/v1/notification-channels")
        one = client.get(f"/api/v1/notification-channels/{created.json()['id']}")
        assert listed.status_code == one.status_code == 200, (role, listed.content)
        for response in (listed, one):
            assert b"abcdefghijklmnop" not in response.content and b"/services/" not in response.content, role
        assert one.json()["target"] == "https://hooks.slack.com/…WXYZ"


def test_writing_back_the_masked_url_keeps_it_and_a_new_url_replaces_it(world: World) -> None:
    client = _api(world)
    created = _webhook(client, kind="webhook_slack", name="slack", target=SLACK_URL, secret="").json()
    url = f"/api/v1/notification-channels/{created['id']}"
    echoed = client.put(url, {**created, "events": ["arrived", "expiring"]}, format="json")  # a read-modify-write
    assert echoed.status_code == 200, echoed.content
    assert NotificationChannel.objects.get(pk=created["id"]).target == SLACK_URL
    other = "https://hooks.slack.com/services/T1111/B1111/zyxwvutsrqponmlkABCD"
    assert client.patch(url, {"target": other}, format="json").json()["target"] == "https://hooks.slack.com/…ABCD"
    assert NotificationChannel.objects.get(pk=created["id"]).target == other
    said = json.dumps([r.details for r in ConfigChange.objects.filter(action__startswith="notification_channel")])
    assert "abcdefghijklmnop" not in said and "zyxwvutsrqponmlk" not in said


def test_a_short_path_shows_no_tail_and_an_email_channel_no_url() -> None:
    from approvals.channels import shown_target

    assert shown_target("https://hooks.example.com/approvals") == "https://hooks.example.com/…"
    assert shown_target("http://127.0.0.1:8080/hooks/approval-notices") == "http://127.0.0.1:8080/…ices"
    assert shown_target("") == ""


def test_the_admin_shows_a_channels_url_masked_to_a_viewer_and_to_whoever_may_change_it(world: World) -> None:
    channel = _channel(world, kind="webhook_slack", name="slack", target=SLACK_URL)
    page = f"/admin/approvals/notificationchannel/{channel.pk}/change/"
    for person in (world.viewer, world.operator):
        client = Client()
        client.force_login(person)
        shown = client.get(page)
        assert shown.status_code == 200, person
        assert b"abcdefghijklmnop" not in shown.content and "…WXYZ".encode() in shown.content, person
    client = Client()
    client.force_login(world.operator)
    form = {"name": "slack", "kind": "webhook_slack", "target": "https://hooks.slack.com/…WXYZ", "events": ["arrived"],
            "enabled": "on"}
    saved = client.post(page, form)
    assert saved.status_code == 302, saved.content[:3000]
    channel.refresh_from_db()
    assert channel.target == SLACK_URL and channel.events == ["arrived"]  # the masked URL sent back kept the real one


def test_a_request_whose_arrival_notice_task_was_lost_is_announced_by_the_sweep(world: World, monkeypatch: Any) -> None:
    # issue #50's fault suite: with Redis emptied, 8 requests' notice tasks were lost and never announced
    request = _request(world, _refund_tool(world))
    _channel(world, kind="email", name="mail")
    sent: list[Any] = []
    monkeypatch.setattr(tasks.deliver_task, "delay", sent.append)
    tasks.expire_approvals_task()
    assert sent == [] and not Delivery.objects.filter(request=request).exists()  # its own task may be on its way
    ApprovalRequest.objects.filter(pk=request.pk).update(requested_at=timezone.now() - timedelta(minutes=5))
    tasks.expire_approvals_task()
    [delivery] = Delivery.objects.filter(request=request, event="arrived")
    assert sent == [delivery.pk]
    sent.clear()
    tasks.expire_approvals_task()
    assert sent == [], "announced once"
