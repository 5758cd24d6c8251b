"""The agent admin is a client of the agent services: the same audit rows as the API, a slug made once."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agents.models import Agent
from audit.models import ConfigChange
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _post(client: Client, url: str, data: dict[str, Any]) -> Any:
    """Post ``data`` with the page's inline formsets left as they are (their management forms included)."""
    page = client.get(url)
    assert page.status_code == 200
    full = dict(data)
    for inline in page.context["inline_admin_formsets"]:
        management = inline.formset.management_form
        for name in management.fields:
            full[f"{management.prefix}-{name}"] = management[name].value()
    return client.post(url, full)


def test_adding_an_agent_in_the_admin_writes_the_services_audit_row(world: World) -> None:
    # when the tenant's operator adds an agent through the admin
    response = _post(_client(world.operator), reverse("admin:agents_agent_add"),
                     {"tenant": world.tenant.pk, "slug": "triage", "name": "Triage", "description": ""})
    # then it exists, and the agent service recorded who made it
    assert response.status_code == 302, response.content[:800]
    agent = Agent.objects.get(tenant=world.tenant, slug="triage")
    row = ConfigChange.objects.get(tenant=world.tenant, action="agent.created", target_id=str(agent.pk))
    assert row.actor_id == world.operator.pk and row.details == {"slug": "triage", "kind": "agent"}


def test_renaming_an_agent_is_audited_and_its_slug_cannot_change(world: World) -> None:
    url = reverse("admin:agents_agent_change", args=[world.agent.pk])
    client = _client(world.operator)
    # given the change form: the slug and the tenant are shown, not editable
    form = client.get(url).context["adminform"].form
    assert "slug" not in form.fields and "tenant" not in form.fields
    old_name = world.agent.name
    # when the operator renames the agent (and smuggles a slug into the post)
    response = _post(client, url, {"name": "Renamed", "description": "new words", "slug": "hijacked",
                                    "current_version": world.agent.current_version_id})
    # then the name changed, the slug did not, and the service's row says what changed and what it was before
    assert response.status_code == 302, response.content[:800]
    world.agent.refresh_from_db()
    assert (world.agent.name, world.agent.slug) == ("Renamed", world.agent.slug)
    assert world.agent.slug != "hijacked"
    row = ConfigChange.objects.get(tenant=world.tenant, action="agent.changed", target_id=str(world.agent.pk))
    assert row.actor_id == world.operator.pk
    assert row.details["fields"] == ["description", "name"] and row.details["before"]["name"] == old_name


def test_another_tenants_operator_cannot_open_or_rename_the_agent(world: World) -> None:
    other = make_world()
    url = reverse("admin:agents_agent_change", args=[world.agent.pk])
    client = _client(other.operator)
    assert client.get(url).status_code in (302, 404)
    client.post(url, {"name": "pwned", "description": ""})
    world.agent.refresh_from_db()
    assert world.agent.name != "pwned"
    assert not ConfigChange.objects.filter(action="agent.changed", target_id=str(world.agent.pk)).exists()
