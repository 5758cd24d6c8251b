"""Every admin page an operator manages: their tenant's rows are there (200), another tenant's are not
(left out of the list; the change page sends them away as a missing object)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import services as tenant_services
from agents.models import AgentVersion, RunEvent, Session
from agents.services import start_run
from approvals.channels import create_channel
from approvals.models import ApprovalRequest, Delivery
from audit.models import ConfigChange, ToolCallAudit
from marketplace import services
from marketplace.models import InstallStatus, Plugin, PluginInstall, PresetAgent, ReleaseWeight
from tenants.models import ApiKey, Membership, Role
from tenants.scoping import actor_for_user
from tests.factories import World, make_user, make_world
from tools.models import Tool

pytestmark = pytest.mark.django_db


def populate(world: World) -> dict[str, Any]:
    """One row of every model an operator manages, in this world's tenant."""
    owner = make_user(f"{world.tenant.slug}-owner", is_staff=True)
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    install = services.install_plugin(tenant=world.tenant, plugin_key="flight-desk", actor=actor_for_user(owner))
    agent = services.create_agent_from_preset(tenant=world.tenant, plugin_key="flight-desk", preset_slug="flight-assistant",
                                              actor=actor_for_user(world.operator))
    v2 = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner", tools=world.version.tools)
    services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor_for_user(world.operator))
    guard = services.set_release_guard(agent=world.agent, metric="error_rate", threshold=0.3, actor=actor_for_user(world.operator))
    tool = Tool.objects.get(tenant=world.tenant, name="query_order")
    rollout = services.set_tool_rollout(tool=tool, enabled_percent=25, actor=actor_for_user(world.operator))
    run = start_run(actor=actor_for_user(world.operator), agent=world.agent, text="where is O202411280001?")
    event = RunEvent.objects.create(tenant=world.tenant, run=run, seq=1, type="run.started", span_id="s1", at=timezone.now())
    channel = create_channel(actor=actor_for_user(world.operator), tenant=world.tenant, values={
        "name": f"{world.tenant.slug}-hook", "kind": "webhook_slack", "target": "https://hooks.example.com/x", "events": ["arrived"]})
    approval = ApprovalRequest.objects.create(tenant=world.tenant, run=run, step=1, call_id="c0", tool=tool, tool_name=tool.name,
                                              arguments={}, arguments_hash="0" * 64, expires_at=timezone.now())
    delivery = Delivery.objects.create(tenant=world.tenant, channel=channel, request=approval, event="arrived")
    audit_row = ToolCallAudit.objects.create(tenant=world.tenant, run=run, call_id="c1", tool_name="query_order", status="ok")
    return {
        "tenants.tenant": world.tenant,
        "tenants.membership": Membership.objects.get(tenant=world.tenant, user=world.operator),
        "tenants.apikey": ApiKey.objects.get(pk=world.key.pk),
        "agents.agent": world.agent,
        "agents.agentversion": v2,
        "agents.session": Session.objects.get(pk=run.session_id),
        "agents.run": run,
        "agents.runevent": event,
        "tools.tool": tool,
        "approvals.notificationchannel": channel,
        "approvals.delivery": delivery,
        "marketplace.plugininstall": install,
        "marketplace.releaseweight": ReleaseWeight.objects.get(agent=world.agent, version=v2),
        "marketplace.releaseguard": guard,
        "marketplace.toolrollout": rollout,
        "marketplace.presetagent": PresetAgent.objects.get(agent=agent),
        "audit.configchange": ConfigChange.objects.filter(tenant=world.tenant).first(),
        "audit.toolcallaudit": audit_row,
    }


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def worlds() -> tuple[World, World, dict[str, Any]]:
    mine, theirs = make_world(), make_world()
    return mine, theirs, populate(mine)


def urls(label: str, obj: Any) -> tuple[str, str]:
    app, model = label.split(".")
    return reverse(f"admin:{app}_{model}_changelist"), reverse(f"admin:{app}_{model}_change", args=[obj.pk])


def test_the_tenants_operator_sees_every_page(worlds: tuple[World, World, dict[str, Any]]) -> None:
    mine, _, rows = worlds
    client = logged_in(mine.operator)
    for label, obj in rows.items():
        changelist, change = urls(label, obj)
        listed = client.get(changelist)
        assert listed.status_code == 200, label
        assert obj.pk in {o.pk for o in listed.context["cl"].result_list}, label
        assert client.get(change).status_code == 200, label


def test_another_tenants_operator_finds_nothing(worlds: tuple[World, World, dict[str, Any]]) -> None:
    _, theirs, rows = worlds
    client = logged_in(theirs.operator)
    for label, obj in rows.items():
        changelist, change = urls(label, obj)
        listed = client.get(changelist)
        assert listed.status_code == 200, label
        assert obj.pk not in {o.pk for o in listed.context["cl"].result_list}, label
        response = client.get(change)
        assert response.status_code in (302, 403, 404), label
        if response.status_code == 302:  # Django's answer to a missing object: back to the index, with a message
            assert response["Location"] == reverse("admin:index"), label
            assert any("doesn’t exist" in str(m) for m in get_messages(response.wsgi_request)), label


def test_the_catalog_is_read_only_and_the_same_for_everyone(worlds: tuple[World, World, dict[str, Any]]) -> None:
    mine, theirs, _ = worlds
    plugin = Plugin.objects.get(key="flight-desk", available=True)
    for user in (mine.operator, theirs.operator):
        client = logged_in(user)
        assert client.get(reverse("admin:marketplace_plugin_changelist")).status_code == 200
        page = client.get(reverse("admin:marketplace_plugin_change", args=[plugin.pk]))
        assert page.status_code == 200 and b'name="_save"' not in page.content
        assert client.get(reverse("admin:marketplace_plugin_add")).status_code == 403


def test_admin_actions_call_the_services(worlds: tuple[World, World, dict[str, Any]]) -> None:
    mine, theirs, rows = worlds
    changelist = reverse("admin:marketplace_plugininstall_changelist")
    install = rows["marketplace.plugininstall"]

    # another tenant's operator cannot reach the install with an action
    logged_in(theirs.operator).post(changelist, {"action": "disable", "_selected_action": [install.pk]})
    assert PluginInstall.objects.get(pk=install.pk).status == InstallStatus.INSTALLED

    client = logged_in(mine.operator)
    client.post(changelist, {"action": "disable", "_selected_action": [install.pk]})
    assert PluginInstall.objects.get(pk=install.pk).status == InstallStatus.DISABLED
    assert ConfigChange.objects.filter(action="plugin.disabled", actor=mine.operator).exists()

    # instant rollback from the release weights list
    weight = rows["marketplace.releaseweight"]
    client.post(reverse("admin:marketplace_releaseweight_changelist"), {"action": "rollback", "_selected_action": [weight.pk]})
    assert ReleaseWeight.objects.get(pk=weight.pk).weight == 0
    assert ConfigChange.objects.filter(action="release.rolled_back", actor=mine.operator).exists()

    # the tool kill switch as a list action, audited through the service
    tool = rows["tools.tool"]
    client.post(reverse("admin:tools_tool_changelist"), {"action": "switch_off", "_selected_action": [tool.pk]})
    assert not Tool.objects.get(pk=tool.pk).enabled
    assert ConfigChange.objects.filter(action="tool.disabled", actor=mine.operator, target_id=str(tool.pk)).exists()

    # a new version from a used one
    client.post(reverse("admin:agents_agentversion_changelist"), {"action": "new_version_from", "_selected_action": [mine.version.pk]})
    assert mine.agent.versions.filter(number=3).exists()


def test_release_weights_inline_on_the_agent_goes_through_the_service(worlds: tuple[World, World, dict[str, Any]]) -> None:
    mine, _, _ = worlds
    client = logged_in(mine.operator)
    url = reverse("admin:agents_agent_change", args=[mine.agent.pk])
    page = client.get(url)
    assert page.status_code == 200 and b"observed (last 200 runs)" in page.content.lower(), page.content.decode()[-6000:]

    rows = list(ReleaseWeight.objects.filter(agent=mine.agent).order_by("version__number"))
    form: dict[str, Any] = {
        "slug": mine.agent.slug, "name": mine.agent.name, "description": "", "tenant": mine.tenant.pk,
        "current_version": mine.version.pk,
        "release_weights-TOTAL_FORMS": len(rows), "release_weights-INITIAL_FORMS": len(rows),
        "release_weights-MIN_NUM_FORMS": 0, "release_weights-MAX_NUM_FORMS": 1000,
    }
    for i, row in enumerate(rows):
        form.update({f"release_weights-{i}-id": row.pk, f"release_weights-{i}-agent": mine.agent.pk,
                     f"release_weights-{i}-version": row.version_id, f"release_weights-{i}-weight": row.weight})
    form["release_weights-1-weight"] = 5
    refused = client.post(url, form)
    assert refused.status_code == 200 and b"add up to 100" in refused.content

    form["release_weights-0-weight"] = 95
    saved = client.post(url, form)
    assert saved.status_code == 302, saved.content[:2000]
    assert dict(ReleaseWeight.objects.filter(agent=mine.agent).values_list("version__number", "weight")) == {1: 95, 2: 5}
    assert ConfigChange.objects.filter(action="release.weights_set", actor=mine.operator,
                                       details__weights={"v1": 95, "v2": 5}).exists()


def test_installing_from_the_admin_add_form(worlds: tuple[World, World, dict[str, Any]]) -> None:
    _, theirs, _ = worlds
    client = logged_in(theirs.operator)
    add = reverse("admin:marketplace_plugininstall_add")
    assert client.get(add).status_code == 200
    for page in ("admin:marketplace_releaseguard_add", "admin:marketplace_toolrollout_add"):
        assert client.get(reverse(page)).status_code == 200

    refused = client.post(add, {"tenant": theirs.tenant.pk, "plugin_key": "order-desk", "config": '{"refund_limit": -5}'})
    assert refused.status_code == 200 and b"refund_limit: -5 is less than the minimum of 0" in refused.content

    saved = client.post(add, {"tenant": theirs.tenant.pk, "plugin_key": "order-desk", "config": '{"refund_limit": 50}'})
    assert saved.status_code == 302
    install = PluginInstall.objects.get(tenant=theirs.tenant, plugin_key="order-desk")
    assert install.status == InstallStatus.PENDING_CONSENT  # an operator cannot grant scopes
    assert ConfigChange.objects.filter(action="plugin.install_pending_consent", actor=theirs.operator).exists()
