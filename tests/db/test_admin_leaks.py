"""The admin offers a tenant's operator nothing of another tenant: no people, no rows, no slugs in a filter,
and who made a version is the user who saved it (security issue 11, hole 7)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.test import Client, RequestFactory
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from accounts import services as tenant_services
from accounts.admin import MembershipInline
from agents.models import Agent, AgentVersion
from agents.services import start_run
from approvals.models import ApprovalRequest
from tenants.models import Role, Tenant
from tenants.scoping import actor_for_user
from tests.db.test_admin_scoping import populate
from tests.factories import World, make_user, make_world
from tools.models import Tool

pytestmark = pytest.mark.django_db

#: Everything of tenant A carries this in its name: it must never appear on a page of tenant B's people.
MARK = "alpha-leak-zq7"


class Both:
    def __init__(self) -> None:
        self.a = make_world(MARK)
        self.b = make_world()
        self.rows_a = populate(self.a)
        self.rows_b = populate(self.b)
        self.a_owner = self.rows_a["tenants.tenant"].memberships.get(role=Role.OWNER).user
        self.b_owner = self.rows_b["tenants.tenant"].memberships.get(role=Role.OWNER).user
        self.a_agent = Agent.objects.create(tenant=self.a.tenant, slug=f"{MARK}-agent", name=f"{MARK} agent")
        AgentVersion.objects.create(tenant=self.a.tenant, agent=self.a_agent, number=1, model="demo/planner")
        run = start_run(actor=actor_for_user(self.a.operator), agent=self.a.agent, text="where is O202411280001?")
        tool = Tool.objects.get(tenant=self.a.tenant, name="query_order")
        ApprovalRequest.objects.create(tenant=self.a.tenant, run=run, step=1, call_id="c1", tool=tool, tool_name=f"{MARK}-tool",
                                       arguments={}, arguments_hash="x", expires_at=timezone.now() + timezone.timedelta(hours=1))


@pytest.fixture
def both() -> Both:
    return Both()


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def form_of(response: Any) -> Any:
    assert response.status_code == 200, response.content[:500]
    return response.context["adminform"].form


def add_version_data(world: World, **extra: Any) -> dict[str, Any]:
    data = {"tenant": world.tenant.pk, "agent": world.agent.pk, "number": 7, "model": "demo/planner", "system_prompt": "",
            "tools": "[]", "policy": "{}", "note": ""}
    return {**data, **extra}


def test_the_version_form_offers_no_other_tenants_people(both: Both) -> None:
    # given tenant B's operator on the add-version page
    form = form_of(logged_in(both.b.operator).get(reverse("admin:agents_agentversion_add")))
    # then the author is not theirs to choose (or, if it were, nobody of tenant A could be chosen)
    if "created_by" in form.fields:
        assert not form.fields["created_by"].queryset.filter(pk__in=[both.a.operator.pk, both.a_owner.pk]).exists()
    assert set(form.fields["agent"].queryset.values_list("tenant_id", flat=True)) == {both.b.tenant.pk}
    assert set(form.fields["tenant"].queryset.values_list("pk", flat=True)) == {both.b.tenant.pk}


def test_the_author_of_a_version_is_the_user_who_saved_it(both: Both) -> None:
    # when tenant B's operator posts a version "created by" tenant A's owner
    response = logged_in(both.b.operator).post(reverse("admin:agents_agentversion_add"),
                                               add_version_data(both.b, created_by=both.a_owner.pk))
    # then it is saved, and made by the operator who saved it (the author is no field of the form)
    assert "created_by" not in form_of(logged_in(both.b.operator).get(reverse("admin:agents_agentversion_add"))).fields
    assert response.status_code == 302, response.content.decode()[-3000:]
    version = AgentVersion.objects.get(agent=both.b.agent, number=7)
    assert version.created_by_id == both.b.operator.pk


CHANGELISTS = ["approvals_approvalrequest", "agents_run", "agents_session", "agents_runevent", "tools_tool", "agents_agent",
               "agents_agentversion", "audit_toolcallaudit", "audit_configchange", "tenants_membership", "tenants_apikey",
               "agents_provider", "marketplace_plugininstall", "marketplace_releaseweight", "marketplace_releaseguard",
               "marketplace_toolrollout", "marketplace_presetagent"]


def test_list_filters_name_only_the_users_tenants(both: Both) -> None:
    client = logged_in(both.b_owner)  # tenant B's owner sees every list
    for page in CHANGELISTS:
        response = client.get(reverse(f"admin:{page}_changelist"))
        assert response.status_code == 200
        # no filter offers tenant A or anything of it
        for spec in response.context["cl"].filter_specs:
            choices = [str(choice.get("display")) for choice in spec.choices(response.context["cl"])]
            assert not any(MARK in choice for choice in choices), (page, spec.title, choices)
        assert MARK not in response.content.decode(), page


def test_the_approvals_filters_list_neither_other_tenants_nor_their_agents(both: Both) -> None:
    response = logged_in(both.b.operator).get(reverse("admin:approvals_approvalrequest_changelist"))
    specs = {getattr(spec, "field_path", spec.title): spec for spec in response.context["cl"].filter_specs}
    assert f"{MARK}-agent" not in {str(v) for v in specs["run__agent__slug"].lookup_choices}
    if "tenant" in specs:  # shown only when there is a choice to make
        assert both.a.tenant.pk not in {pk for pk, _ in specs["tenant"].lookup_choices}


def test_a_superuser_still_sees_every_tenant(both: Both) -> None:
    root = make_user("root", is_staff=True, is_superuser=True)
    client = logged_in(root)
    listed = client.get(reverse("admin:approvals_approvalrequest_changelist"))
    specs = {getattr(spec, "field_path", spec.title): spec for spec in listed.context["cl"].filter_specs}
    assert {both.a.tenant.pk, both.b.tenant.pk} <= {pk for pk, _ in specs["tenant"].lookup_choices}
    assert f"{MARK}-agent" in {str(v) for v in specs["run__agent__slug"].lookup_choices}
    form = form_of(client.get(reverse("admin:tenants_membership_add")))
    assert {both.a_owner.pk, both.b_owner.pk} <= set(form.fields["user"].queryset.values_list("pk", flat=True))


def test_dropdowns_offer_only_the_users_tenants(both: Both) -> None:
    client = logged_in(both.b_owner)
    b_people = {both.b.operator.pk, both.b.viewer.pk, both.b_owner.pk}
    a_people = {both.a.operator.pk, both.a.viewer.pk, both.a_owner.pk}

    members = form_of(client.get(reverse("admin:tenants_membership_add")))
    assert b_people <= set(members.fields["user"].queryset.values_list("pk", flat=True))
    assert not a_people & set(members.fields["user"].queryset.values_list("pk", flat=True))
    assert set(members.fields["tenant"].queryset.values_list("pk", flat=True)) == {both.b.tenant.pk}

    key = form_of(client.get(reverse("admin:tenants_apikey_add")))
    assert not a_people & set(key.fields["created_by"].queryset.values_list("pk", flat=True))

    install = form_of(client.get(reverse("admin:marketplace_plugininstall_add")))
    assert set(install.fields["tenant"].queryset.values_list("pk", flat=True)) == {both.b.tenant.pk}

    guard = form_of(client.get(reverse("admin:marketplace_releaseguard_add")))
    assert set(guard.fields["agent"].queryset.values_list("tenant_id", flat=True)) == {both.b.tenant.pk}
    rollout = form_of(client.get(reverse("admin:marketplace_toolrollout_add")))
    assert set(rollout.fields["tool"].queryset.values_list("tenant_id", flat=True)) == {both.b.tenant.pk}

    request = RequestFactory().get("/")
    request.user = both.b_owner
    inline = MembershipInline(Tenant, admin.site).get_formset(request, both.b.tenant)
    assert b_people <= set(inline.form.base_fields["user"].queryset.values_list("pk", flat=True))
    assert not a_people & set(inline.form.base_fields["user"].queryset.values_list("pk", flat=True))


def test_a_foreign_tenant_or_row_in_a_post_is_a_form_error(both: Both) -> None:
    client = logged_in(both.b.operator)
    # moving tenant B's agent to tenant A: an agent's tenant is not editable once made, so the posted one is ignored
    url = reverse("admin:agents_agent_change", args=[both.b.agent.pk])
    assert "tenant" not in form_of(client.get(url)).fields
    client.post(url, {"slug": "order-assistant", "name": "x", "description": "", "tenant": both.a.tenant.pk,
                      "current_version": both.b.version.pk, "release_weights-TOTAL_FORMS": 0, "release_weights-INITIAL_FORMS": 0})
    assert Agent.objects.get(pk=both.b.agent.pk).tenant_id == both.b.tenant.pk
    # a version for tenant A's agent
    refused = client.post(reverse("admin:agents_agentversion_add"), add_version_data(both.b, agent=both.a_agent.pk))
    assert "agent" in form_of(refused).errors
    assert not AgentVersion.objects.filter(number=7).exists()
    # another tenant's version page is not found
    page = client.get(reverse("admin:agents_agentversion_change", args=[both.a.version.pk]))
    assert page.status_code == 302 and page["Location"] == reverse("admin:index")


def test_rows_of_two_tenants_of_one_user_are_not_linked(both: Both) -> None:
    # given an operator of tenants B and C
    other = Tenant.objects.create(slug="charlie", name="charlie")
    tenant_services.set_membership(tenant=other, user=both.b.operator, role=Role.OPERATOR, actor=None)
    # when they add an agent to tenant C whose current version is one of tenant B's
    refused = logged_in(both.b.operator).post(reverse("admin:agents_agent_add"), {
        "slug": "linked", "name": "linked", "description": "", "tenant": other.pk, "current_version": both.b.version.pk,
        "release_weights-TOTAL_FORMS": 0, "release_weights-INITIAL_FORMS": 0})
    # then the version is refused: a row and what it points to share one tenant
    assert "belongs to another tenant" in str(form_of(refused).errors.get("current_version"))
    assert not Agent.objects.filter(slug="linked").exists()


def test_autocomplete_offers_only_what_the_field_may_hold(both: Both) -> None:
    # given a user who operates tenant B and only views tenant A
    tenant_services.set_membership(tenant=both.a.tenant, user=both.b.operator, role=Role.VIEWER, actor=None)
    response = logged_in(both.b.operator).get(reverse("admin:autocomplete"), {
        "app_label": "agents", "model_name": "agentversion", "field_name": "agent", "term": ""})
    assert response.status_code == 200
    offered = {int(row["id"]) for row in response.json()["results"]}
    assert both.b.agent.pk in offered and both.a_agent.pk not in offered and both.a.agent.pk not in offered


def _url(model: Any, view: str, *args: Any) -> str | None:
    try:
        return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)
    except NoReverseMatch:
        return None


@pytest.mark.parametrize("who", ["operator", "owner", "viewer"])
def test_no_admin_page_shows_another_tenant(both: Both, who: str) -> None:
    """Every registered admin, now and later: its list (with facet counts), add page and change pages of tenant B's rows."""
    client = logged_in({"operator": both.b.operator, "owner": both.b_owner, "viewer": both.b.viewer}[who])
    shown = 0
    for model in admin.site._registry:
        changelist = _url(model, "changelist")
        pages = [url for url in (changelist, changelist and f"{changelist}?_facets=1", _url(model, "add")) if url]
        listed = client.get(changelist) if changelist else None
        if listed is not None and listed.status_code == 200:
            pages += [_url(model, "change", obj.pk) for obj in list(listed.context["cl"].result_list)[:2]]
        for url in pages:
            response = client.get(url)
            assert response.status_code in (200, 403), (url, response.status_code)
            assert MARK not in response.content.decode(), url
            shown += response.status_code == 200
    assert shown > 30
