"""Issue #12: the admin is a client of the services. Walk every registered ModelAdmin as a tenant's people.

1. Every way the admin writes (add, change, delete, bulk delete, inline rows) is an override of ours that calls a
   service, for every admin a tenant member may write through; a new admin that writes the ORM directly fails here.
2. Every admin a tenant operator or owner may change is changed through the real admin page, as a browser would
   post its form back with one field edited: the change is saved and its config-change audit row names the person.
   The walk fails for an admin it does not know how to edit, so a new one must join it.
3. Deletes go through the services too (an audit row, or a refusal on the page and the row kept), and what the
   API refuses the admin refuses (``allow_hosts: ["10.0.0.0/8"]`` on a tool).
"""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.options import InlineModelAdmin, ModelAdmin
from django.contrib.messages import get_messages
from django.test import Client, RequestFactory

from accounts import services as accounts
from agents import provider_services
from agents.models import Agent, AgentVersion, Flow, FlowVersion
from approvals import channels
from audit.models import ConfigChange
from marketplace import services as market
from releases.models import EvaluationSet
from tenants.models import ApiKey, Membership, Role
from tenants.scoping import actor_for_user
from tests.factories import World, make_user, make_world
from tests.support.project import first_party_apps
from tools.models import Tool

pytestmark = pytest.mark.django_db

#: The apps whose admins this walk holds to the services (the others are Django's and django-axes').
OUR_APPS = set(first_party_apps())

WRITES = {
    "add": ("save_model",),
    "change": ("save_model",),
    "delete": ("delete_model", "delete_queryset"),
}


def _ours(klass: type, method: str) -> bool:
    """The method is overridden by our code, not Django's ModelAdmin default (which writes the ORM directly)."""
    return getattr(klass, method) is not getattr(ModelAdmin, method)


class Walk:
    def __init__(self) -> None:
        self.world = make_world()
        self.owner = make_user(f"{self.world.tenant.slug}-owner", is_staff=True)
        accounts.set_membership(tenant=self.world.tenant, user=self.owner, role=Role.OWNER, actor=None)
        owner = actor_for_user(self.owner)
        self.install = market.install_plugin(tenant=self.world.tenant, plugin_key="order-desk", actor=owner)
        self.guard = market.set_release_guard(agent=self.world.agent, metric="error_rate", threshold=0.3, actor=owner)
        golden = EvaluationSet.objects.create(tenant=self.world.tenant, name="walk", agent=self.world.agent)
        self.gate = market.set_release_gate(agent=self.world.agent, evaluation_set=golden, min_pass_rate=0.9, actor=owner)
        self.tool = Tool.objects.get(tenant=self.world.tenant, name="query_order")
        self.rollout = market.set_tool_rollout(tool=self.tool, enabled_percent=25, actor=owner)
        self.provider = provider_services.create_provider(actor=owner, tenant=self.world.tenant,
                                                          values={"name": "walk", "base_url": "https://llm.example.com/v1"})
        self.draft = AgentVersion.objects.create(tenant=self.world.tenant, agent=self.world.agent, number=2, model="demo/planner",
                                                 system_prompt="draft", tools=[], policy={})
        self.spare = Agent.objects.create(tenant=self.world.tenant, slug="spare", name="Spare")
        flow = Agent.objects.create(tenant=self.world.tenant, slug="walk-flow", name="Walk flow", kind="flow")
        self.flow = Flow.objects.get(pk=flow.pk)
        version = AgentVersion.objects.create(tenant=self.world.tenant, agent=flow, number=1, model="demo/planner",
                                              definition={"nodes": [{"id": "look", "kind": "tool", "tool": "query_logistics"}]})
        self.flow_draft = FlowVersion.objects.get(pk=version.pk)
        self.channel = channels.create_channel(actor=owner, tenant=self.world.tenant, values={
            "name": "walk", "kind": "webhook_slack", "target": "https://hooks.example.com/walk", "events": ["arrived"]})
        self.own_tool = Tool.objects.create(tenant=self.world.tenant, name="spare_tool", kind="http", description="unused",
                                            config={"url": "https://api.example.com/x", "method": "GET"})


@pytest.fixture
def walk() -> Walk:
    return Walk()


def _request(user: Any) -> Any:
    request = RequestFactory().get("/admin/")
    request.user = user
    return request


# 1 ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["operator", "owner", "superuser"])
def test_every_admin_a_tenant_member_writes_through_writes_through_a_service(walk: Walk, role: str) -> None:
    people = {"operator": walk.world.operator, "owner": walk.owner}
    user = people[role] if role in people else make_user(is_staff=True, is_superuser=True)
    request = _request(user)
    problems, writable = [], []
    for model, model_admin in admin.site._registry.items():
        label = model._meta.label
        if model._meta.app_label not in OUR_APPS:
            continue  # Django's users and groups, django-axes' lockout records: the platform's, not a tenant's
        allowed = {
            "add": model_admin.has_add_permission(request),
            "change": model_admin.has_change_permission(request),
            "delete": model_admin.has_delete_permission(request),
        }
        for kind, methods in WRITES.items():
            if allowed[kind]:
                writable.append(f"{label}:{kind}")
                problems += [f"{label}: {kind} allowed but {m} is Django's" for m in methods if not _ours(type(model_admin), m)]
        for inline in model_admin.get_inline_instances(request, None) if allowed["change"] or allowed["add"] else []:
            assert isinstance(inline, InlineModelAdmin)
            may_write = (inline.has_add_permission(request, None) or inline.has_change_permission(request)
                         or inline.has_delete_permission(request))
            formset = inline.get_formset(request)
            saver = next(klass for klass in formset.__mro__ if "save" in vars(klass))
            if may_write and not _ours(type(model_admin), "save_formset") and saver.__module__.startswith("django."):
                problems.append(f"{label}: inline {inline.model._meta.label} saves the ORM directly")
        if "delete_selected" in model_admin.get_actions(request) and not _ours(type(model_admin), "delete_queryset"):
            problems.append(f"{label}: bulk delete is Django's")
    assert problems == []
    assert len(writable) >= 8, writable  # the walk reached the admins a tenant writes through


# 2 ------------------------------------------------------------------------------------------------------------------


class _FormValues(HTMLParser):
    """What a browser posts for ``<form id=...>``: inputs (checked boxes only), selected options, textareas."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id, self.inside, self.values = form_id, False, []
        self._select: str | None = None
        self._textarea: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.inside = a.get("id") == self.form_id
        if not self.inside:
            return
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button", "file", "image"):
            if a.get("type") in ("checkbox", "radio") and "checked" not in a:
                return
            self.values.append((name, a.get("value", "on" if a.get("type") == "checkbox" else "")))
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.values.append((self._select, a.get("value", "")))
        elif tag == "textarea" and name:
            self._textarea, self._text = name, []

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "select":
            self._select = None
        elif tag == "textarea" and self._textarea:
            text = "".join(self._text)
            self.values.append((self._textarea, text[1:] if text.startswith("\n") else text))
            self._textarea = None


def _post_back(client: Client, url: str, model: type, edit: dict[str, str]) -> Any:
    page = client.get(url)
    assert page.status_code == 200, (url, page.status_code)
    parser = _FormValues(f"{model._meta.model_name}_form")
    parser.feed(page.content.decode())
    data: dict[str, list[str]] = {}
    for name, value in parser.values:
        data.setdefault(name, []).append(value)
    for name, value in edit.items():
        assert name in data, f"{model._meta.label}: no field {name!r} on the change form; fields: {sorted(data)}"
        data[name] = [value]
    data["_save"] = ["Save"]
    return client.post(url, data)


def _form_errors(response: Any) -> Any:
    """What the admin form said, for an assertion message."""
    return dict(response.context["adminform"].form.errors) if response.context else response.status_code


def _url(obj: Any, view: str = "change") -> str:
    return f"/admin/{obj._meta.app_label}/{obj._meta.model_name}/{obj.pk}/{view}/"


#: How the walk edits each admin a tenant member may change: (who, the object, the field and new value, the audit action).
def _edits(w: Walk) -> dict[str, tuple[str, Any, dict[str, str], str]]:
    viewer_membership = Membership.objects.get(tenant=w.world.tenant, user=w.world.viewer)
    return {
        "tenants.Tenant": ("owner", w.world.tenant, {"name": "Renamed shop"}, "tenant.changed"),
        "tenants.Membership": ("owner", viewer_membership, {"role": Role.APPROVER}, "membership.changed"),
        "tenants.ApiKey": ("owner", w.world.key, {"name": "renamed key"}, "api_key.renamed"),
        "agents.Agent": ("operator", w.world.agent, {"description": "edited in the admin"}, "agent.changed"),
        "agents.AgentVersion": ("operator", w.draft, {"note": "edited in the admin"}, "agent_version.updated"),
        "agents.Flow": ("operator", w.flow, {"description": "edited in the admin"}, "agent.changed"),
        "agents.FlowVersion": ("operator", w.flow_draft, {"note": "edited in the admin"}, "agent_version.updated"),
        "agents.Provider": ("operator", w.provider, {"requests_per_minute": "120"}, "provider.changed"),
        "approvals.NotificationChannel": ("operator", w.channel, {"name": "renamed channel"}, "notification_channel.update"),
        "tools.Tool": ("operator", w.own_tool, {"description": "edited in the admin"}, "tool.updated"),
        "marketplace.PluginInstall": ("operator", w.install, {"config": '{"refund_limit": 50}'}, "plugin.configured"),
        "marketplace.ReleaseGuard": ("operator", w.guard, {"threshold": "0.4"}, "release.guard_changed"),
        "marketplace.ToolRollout": ("operator", w.rollout, {"enabled_percent": "30"}, "tool.rollout_set"),
        "marketplace.ReleaseGate": ("operator", w.gate, {"min_pass_rate": "0.75"}, "release.gate_set"),
    }


def test_every_admin_a_tenant_member_may_change_saves_through_its_service_with_an_audit_row(walk: Walk) -> None:
    edits = _edits(walk)
    people = {"operator": walk.world.operator, "owner": walk.owner}
    changeable = set()
    for model, model_admin in admin.site._registry.items():
        if any(model_admin.has_change_permission(_request(user)) for user in people.values()):
            changeable.add(model._meta.label)
    assert changeable == set(edits), "the walk must know how to edit every admin a tenant member may change"

    for label, (who, obj, edit, action) in edits.items():
        client = Client()
        client.force_login(people[who])
        before = ConfigChange.objects.filter(tenant=walk.world.tenant, action=action).count()
        response = _post_back(client, _url(obj), type(obj), edit)
        assert response.status_code == 302, (label, response.content.decode()[-3000:])
        rows = ConfigChange.objects.filter(tenant=walk.world.tenant, action=action).order_by("-id")
        assert rows.count() == before + 1, f"{label}: no {action} audit row"
        assert rows[0].actor_id == people[who].pk, label
        saved = type(obj).objects.get(pk=obj.pk)
        for name, value in edit.items():
            if name == "config":
                assert saved.config["refund_limit"] == 50
            else:
                assert str(getattr(saved, name)) == value, (label, name)


def test_what_only_the_platform_may_set_is_read_only_to_a_tenant_owner(walk: Walk) -> None:
    client = Client()
    client.force_login(walk.owner)
    parser = _FormValues("tenant_form")
    parser.feed(client.get(_url(walk.world.tenant)).content.decode())
    assert {name for name, _ in parser.values}.isdisjoint({"slug", "is_active", "settings"})
    with pytest.raises(Exception, match="platform administrator"):
        accounts.update_tenant(tenant=walk.world.tenant, actor=actor_for_user(walk.owner), settings={"secrets": ["X"]})


# 3 ------------------------------------------------------------------------------------------------------------------


def _delete(client: Client, obj: Any) -> Any:
    return client.post(_url(obj, "delete"), {"post": "yes"})


def test_deletes_in_the_admin_go_through_the_services(walk: Walk) -> None:
    operator, owner = Client(), Client()
    operator.force_login(walk.world.operator)
    owner.force_login(walk.owner)
    cases = [
        (operator, walk.spare, "agent.deleted"),
        (operator, walk.draft, "agent_version.deleted"),
        (operator, walk.provider, "provider.deleted"),
        (operator, walk.own_tool, "tool.deleted"),
        (operator, walk.rollout, "tool.rollout_set"),
        (operator, walk.gate, "release.gate_removed"),
        (owner, Membership.objects.get(tenant=walk.world.tenant, user=walk.world.viewer), "membership.removed"),
    ]
    for client, obj, action in cases:
        response = _delete(client, obj)
        assert response.status_code == 302, (obj, response.status_code)
        assert not type(obj).objects.filter(pk=obj.pk).exists(), obj
        row = ConfigChange.objects.filter(tenant=walk.world.tenant, action=action).latest("id")
        assert row.actor_id in (walk.world.operator.pk, walk.owner.pk), action

    # keys are revoked, tenants deactivated: never deleted
    assert _delete(owner, walk.world.key).status_code == 403
    assert _delete(owner, walk.world.tenant).status_code == 403


def test_a_refused_delete_says_why_on_the_page_and_keeps_the_row(walk: Walk) -> None:
    owner = Client()
    owner.force_login(walk.owner)
    last_owner = Membership.objects.get(tenant=walk.world.tenant, user=walk.owner)
    response = _delete(owner, last_owner)
    assert response.status_code == 302
    assert Membership.objects.filter(pk=last_owner.pk).exists()
    shown = [str(m) for m in get_messages(response.wsgi_request)]
    assert any("last owner" in m for m in shown), shown

    used = Tool.objects.get(tenant=walk.world.tenant, name=walk.world.version.tools[0])
    operator = Client()
    operator.force_login(walk.world.operator)
    bulk = operator.post("/admin/tools/tool/", {"action": "delete_selected", "_selected_action": [used.pk], "post": "yes"})
    assert bulk.status_code == 302 and Tool.objects.filter(pk=used.pk).exists()
    assert not ConfigChange.objects.filter(action="tool.deleted", target_id=str(used.pk)).exists()


def test_the_admin_refuses_what_the_api_refuses_and_writes_nothing(walk: Walk) -> None:
    operator = Client()
    operator.force_login(walk.world.operator)
    before = ConfigChange.objects.filter(tenant=walk.world.tenant).count()
    response = _post_back(operator, _url(walk.own_tool), Tool, {
        "config": '{"url": "http://10.0.0.5/x", "method": "GET", "allow_hosts": ["10.0.0.0/8"]}'})
    assert response.status_code == 200  # the form again, with the error
    assert "platform administrator" in response.content.decode()
    assert "10.0.0.0/8" not in str(Tool.objects.get(pk=walk.own_tool.pk).config)
    assert ConfigChange.objects.filter(tenant=walk.world.tenant).count() == before


def test_api_keys_and_members_through_the_admin_are_audited_and_role_checked(walk: Walk) -> None:
    operator = Client()
    operator.force_login(walk.world.operator)
    # an operator does not manage keys: the key's page is not theirs to change
    assert operator.post(_url(walk.world.key), {"name": "mine now"}).status_code == 403
    assert ApiKey.objects.get(pk=walk.world.key.pk).name == walk.world.key.name
    other: World = make_world()
    with pytest.raises(Exception, match="No such object"):
        accounts.rename_api_key(key=other.key, name="hijacked", actor=actor_for_user(walk.owner))


def test_members_added_changed_and_removed_on_the_tenant_page_go_through_the_services(walk: Walk) -> None:
    """The members inline of the tenant page (Django shows it to superusers: it needs the model permissions)."""
    admin_user = make_user(is_staff=True, is_superuser=True)
    newcomer = make_user()
    client = Client()
    client.force_login(admin_user)
    url = _url(walk.world.tenant)
    parser = _FormValues("tenant_form")
    parser.feed(client.get(url).content.decode())
    data: dict[str, list[str]] = {}
    for name, value in parser.values:
        data.setdefault(name, []).append(value)
    assert any(k.endswith("-TOTAL_FORMS") for k in data), sorted(data)
    prefix = next(k for k in data if k.endswith("-TOTAL_FORMS")).removesuffix("-TOTAL_FORMS")
    rows = int(data[f"{prefix}-TOTAL_FORMS"][0])
    viewer_row = next(i for i in range(rows) if data.get(f"{prefix}-{i}-user") == [str(walk.world.viewer.pk)])
    data[f"{prefix}-{viewer_row}-DELETE"] = ["on"]
    data[f"{prefix}-TOTAL_FORMS"] = [str(rows + 1)]
    data[f"{prefix}-{rows}-user"] = [str(newcomer.pk)]
    data[f"{prefix}-{rows}-role"] = [Role.VIEWER]
    data[f"{prefix}-{rows}-tenant"] = [str(walk.world.tenant.pk)]
    data["_save"] = ["Save"]
    response = client.post(url, data)
    assert response.status_code == 302, _form_errors(response)
    assert Membership.objects.filter(tenant=walk.world.tenant, user=newcomer, role=Role.VIEWER).exists()
    assert not Membership.objects.filter(tenant=walk.world.tenant, user=walk.world.viewer).exists()
    rows_by = ConfigChange.objects.filter(tenant=walk.world.tenant, actor=admin_user)
    assert rows_by.filter(action="membership.created", details__user=newcomer.username).exists()
    assert rows_by.filter(action="membership.removed", details__user=walk.world.viewer.username).exists()


def test_a_refusal_after_the_form_validated_shows_the_form_again_with_what_was_typed(
    walk: Walk, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rule the form cannot see (a race: another operator's change in between) refuses in the service.
    from agents import services as agent_services
    from agents.services import RunRefused

    def refuse(**_: Any) -> Any:
        raise RunRefused("Another change to this version landed first; review it and save again.", field="note")

    monkeypatch.setattr(agent_services, "update_version", refuse)
    operator = Client()
    operator.force_login(walk.world.operator)
    before = ConfigChange.objects.filter(tenant=walk.world.tenant).count()
    response = _post_back(operator, _url(walk.draft), AgentVersion, {"note": "typed with care"})
    page = response.content.decode()
    assert response.status_code == 200  # the form again, not a redirect that drops the input
    assert "Not saved: Another change to this version landed first" in page
    assert "typed with care" in page
    assert AgentVersion.objects.get(pk=walk.draft.pk).note != "typed with care"
    assert ConfigChange.objects.filter(tenant=walk.world.tenant).count() == before


def test_a_flow_version_is_edited_as_a_checked_document_and_drawn(walk: Walk) -> None:
    operator = Client()
    operator.force_login(walk.world.operator)
    page = operator.get(_url(walk.flow_draft)).content.decode()
    assert 'data-document="FlowDefinition"' in page and 'class="flow-graph"' in page and 'data-node="look"' in page
    cyclic = ('{"nodes": [{"id": "a", "kind": "tool", "tool": "query_logistics", "after": ["b"]}, '
              '{"id": "b", "kind": "tool", "tool": "query_logistics", "after": ["a"]}]}')
    response = _post_back(operator, _url(walk.flow_draft), FlowVersion, {"definition": cyclic})
    assert response.status_code == 200 and "nodes: a cycle " in response.content.decode()
    two = ('{"nodes": [{"id": "look", "kind": "tool", "tool": "query_logistics"}, '
           '{"id": "tell", "kind": "llm", "after": ["look"], "prompt": "Say {nodes.look}"}]}')
    response = _post_back(operator, _url(walk.flow_draft), FlowVersion, {"definition": two})
    assert response.status_code == 302, _form_errors(response)
    saved = AgentVersion.objects.get(pk=walk.flow_draft.pk).definition
    assert [n["id"] for n in saved["nodes"]] == ["look", "tell"] and saved["nodes"][1]["timeout_seconds"] == 60
    # the agents' admin lists agents only, the flows' admin flows only
    assert f"/admin/agents/agent/{walk.flow.pk}/change/" not in operator.get("/admin/agents/agent/").content.decode()
    flows = operator.get("/admin/agents/flow/").content.decode()
    assert f"/admin/agents/flow/{walk.flow.pk}/change/" in flows and f"/flow/{walk.world.agent.pk}/change/" not in flows
