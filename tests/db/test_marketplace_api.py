"""The marketplace API: catalog, installs, release weights — with operators' keys, scoped to their tenant."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts import services as tenant_services
from agents.models import AgentVersion
from marketplace.models import PluginInstall
from tenants.models import Role
from tests.factories import make_user, make_world

pytestmark = pytest.mark.django_db


def client_for(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def owner_key(world: Any) -> str:
    owner = make_user(f"{world.tenant.slug}-owner")
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    return tenant_services.create_api_key(tenant=world.tenant, name="owner", owner=owner, role=Role.OWNER, actor=None)[1]


def test_the_catalog_lists_the_builtin_plugins() -> None:
    world = make_world()
    response = client_for(world.raw_key).get("/api/v1/plugins")
    assert response.status_code == 200
    keys = {p["key"] for p in response.json()}
    assert {"order-desk", "flight-desk"} <= keys
    detail = client_for(world.raw_key).get("/api/v1/plugins/flight-desk").json()
    assert "rebook_flight" in [t["name"] for t in detail["tools"]] and detail["presets"][0]["slug"] == "flight-assistant"


def test_install_consent_and_disable_through_the_api() -> None:
    world, other = make_world(), make_world()
    operator = client_for(world.raw_key)

    bad = operator.post("/api/v1/plugin-installs", {"plugin": "order-desk", "config": {"refund_limit": "lots"}}, format="json")
    assert bad.status_code == 400
    assert bad.json()["config"][0].startswith("refund_limit: 'lots' is not of type 'number'")

    created = operator.post("/api/v1/plugin-installs", {"plugin": "order-desk"}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["status"] == "pending_consent" and body["pending_version"] and body["tools"] == []

    # an operator may not consent; an owner may
    assert operator.post(f"/api/v1/plugin-installs/{body['id']}/accept-consent").status_code == 403
    accepted = client_for(owner_key(world)).post(f"/api/v1/plugin-installs/{body['id']}/accept-consent")
    assert accepted.status_code == 200 and accepted.json()["status"] == "installed"
    assert "refund_order" in accepted.json()["tools"]

    # another tenant's key does not see it at all
    assert client_for(other.raw_key).get(f"/api/v1/plugin-installs/{body['id']}").status_code == 404
    assert client_for(other.raw_key).post(f"/api/v1/plugin-installs/{body['id']}/disable").status_code == 404
    assert client_for(other.raw_key).get("/api/v1/plugin-installs").json() == []

    disabled = operator.post(f"/api/v1/plugin-installs/{body['id']}/disable")
    assert disabled.status_code == 200 and disabled.json()["status"] == "disabled"
    refused = operator.post(f"/api/v1/plugin-installs/{body['id']}/upgrade")
    assert refused.status_code == 400
    assert refused.json()["status"] == ["order-desk is disabled here; enable it before upgrading."]
    assert operator.delete(f"/api/v1/plugin-installs/{body['id']}").status_code == 204
    assert not PluginInstall.objects.filter(pk=body["id"]).exists()


def test_release_weights_through_the_api() -> None:
    world, other = make_world(), make_world()
    AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner", tools=world.version.tools)
    operator = client_for(world.raw_key)
    url = f"/api/v1/releases/{world.agent.slug}"

    wrong = operator.put(url, {"weights": {"1": 90, "2": 5}}, format="json")
    assert wrong.status_code == 400
    assert wrong.json() == {"weights": ["Weights must add up to 100; v1 90, v2 5 add up to 95."], "error": {
        "code": "invalid", "message": "Weights must add up to 100; v1 90, v2 5 add up to 95.", "field": "weights"}}

    ok = operator.put(url, {"weights": {"1": 90, "2": 10}}, format="json")
    assert ok.status_code == 200, ok.content
    assert [(w["version"], w["weight"]) for w in ok.json()["weights"]] == [(1, 90), (2, 10)]
    assert ok.json()["stable_version"] == 1

    rolled = operator.post(f"{url}/rollback", {"version": 2, "reason": "complaints"}, format="json")
    assert rolled.status_code == 200
    assert [(w["version"], w["weight"]) for w in rolled.json()["weights"]] == [(1, 100), (2, 0)]

    # the other tenant has its own order-assistant: it sees that one, never this one's weights
    assert client_for(other.raw_key).get(url).json()["weights"] == []
    viewer_key = tenant_services.create_api_key(tenant=world.tenant, name="v", owner=world.viewer, role=Role.VIEWER, actor=None)[1]
    assert client_for(viewer_key).get(url).status_code == 200
    assert client_for(viewer_key).put(url, {"weights": {"1": 100}}, format="json").status_code == 403


def test_a_foreign_tenant_s_install_is_not_found_by_every_service_a_role_elsewhere_is_refused() -> None:
    """The one tenancy rule in the marketplace's services too (API, admin and commands call them): an actor with no role
    in the install's tenant gets 404, never a 403 that confirms the install exists; a role without the action, 403."""
    from core.errors import Forbidden, NotFound
    from marketplace import installs
    from tenants.scoping import actor_for_api_key

    world, other = make_world(), make_world()
    install = installs.install_plugin(tenant=world.tenant, plugin_key="order-desk", actor=actor_for_api_key(world.key))
    foreign = actor_for_api_key(other.key)
    for change in (installs.disable_plugin, installs.enable_plugin, installs.upgrade_plugin, installs.accept_consent,
                   installs.uninstall_plugin):
        with pytest.raises(NotFound):
            change(install=install, actor=foreign)
    with pytest.raises(NotFound):
        installs.configure_plugin(install=install, config={}, actor=foreign)
    with pytest.raises(NotFound):
        installs.install_plugin(tenant=world.tenant, plugin_key="flight-desk", actor=foreign)
    viewer = make_user(f"{world.tenant.slug}-reader")
    tenant_services.set_membership(tenant=world.tenant, user=viewer, role=Role.VIEWER, actor=None)
    from tenants.scoping import actor_for_user

    with pytest.raises(Forbidden):
        installs.disable_plugin(install=install, actor=actor_for_user(viewer))
    assert PluginInstall.objects.get(pk=install.pk).status == install.status != "disabled"
