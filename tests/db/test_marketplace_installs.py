"""Per-tenant installs: install, consent, upgrade, disable, uninstall, presets, config — all audited."""

from __future__ import annotations

from typing import Any

import pytest

from accounts import services as tenant_services
from agents.models import Agent
from agents.services import RunRefused, start_run
from audit.models import ConfigChange
from core.errors import NotFound
from marketplace import installs, services
from marketplace.access import resolvable_tools, tool_allowed_for
from marketplace.catalog import AgentPreset, PluginCatalog, PluginSpec, PluginTool
from marketplace.models import InstallStatus, PluginInstall
from tenants.models import Role
from tenants.scoping import actor_for_user
from tests.factories import make_user, make_world
from tools.models import Tool, ToolKind

pytestmark = pytest.mark.django_db


def owner_of(tenant: Any) -> Any:
    user = make_user(f"{tenant.slug}-owner", is_staff=True)
    tenant_services.set_membership(tenant=tenant, user=user, role=Role.OWNER, actor=None)
    return user


def flight_catalog(version: str, *, rebook: bool, hosts: tuple[str, ...] = ()) -> PluginCatalog:
    """A catalog whose flight-desk is at ``version``; with ``rebook`` it adds the write tool and its scope."""
    tools = [PluginTool("flight_desk.search_flights"), PluginTool("flight_desk.rebooking_policy")]
    presets = [AgentPreset(slug="flight-lookup", name="Flight lookup", system_prompt="Find flights.", model="demo/planner",
                           tools=("search_flights",))]
    scopes = ["bookings:read"]
    if rebook:
        tools.append(PluginTool("flight_desk.rebook_flight", requires_approval=True))
        presets.append(AgentPreset(slug="flight-assistant", name="Flight assistant", system_prompt="Rebook.", model="demo/planner",
                                   tools=("search_flights", "rebook_flight")))
        scopes.append("bookings:change")
    plugins = PluginCatalog()
    plugins.register(PluginSpec(key="flight-desk", name="Flight desk", version=version, tools=tuple(tools),
                                presets=tuple(presets), scopes=tuple(scopes), hosts=hosts))
    plugins.freeze()
    return plugins


def names(tenant: Any) -> set[str]:
    return set(resolvable_tools(tenant.pk).values_list("name", flat=True))


def test_an_operators_install_waits_for_an_owners_consent() -> None:
    world = make_world()
    owner = owner_of(world.tenant)

    # when an operator installs order-desk, which needs scopes
    install = services.install_plugin(tenant=world.tenant, plugin_key="order-desk", actor=actor_for_user(world.operator))

    # then it waits for consent and provides no tool yet
    assert install.status == InstallStatus.PENDING_CONSENT and install.plugin is None
    assert "refund_order" not in names(world.tenant)
    with pytest.raises(services.NotAllowed, match="owner"):
        services.accept_consent(install=install, actor=actor_for_user(world.operator))

    # when the owner accepts
    install = services.accept_consent(install=install, actor=actor_for_user(owner))

    # then the plugin's tools exist, linked to the install (the tenant's own copies of the same functions adopted)
    assert install.status == InstallStatus.INSTALLED and install.granted_scopes == ["orders:read", "orders:refund"]
    linked = {t.name: t for t in Tool.objects.filter(plugin_install=install)}
    assert set(linked) == {"query_order", "query_logistics", "sum_order_totals", "refund_order"}
    refund = linked["refund_order"]
    assert refund.requires_approval and refund.category == "write" and not refund.idempotent
    assert refund.required_scopes == ["orders:refund"]
    assert "refund_order" in names(world.tenant)
    actions = list(ConfigChange.objects.filter(tenant=world.tenant, action__startswith="plugin.")
                   .order_by("id").values_list("action", "actor"))
    assert actions == [("plugin.install_pending_consent", world.operator.pk), ("plugin.consent_accepted", owner.pk)]


def test_an_upgrade_adding_tools_scopes_and_hosts_is_held_until_consent(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    owner = owner_of(world.tenant)
    monkeypatch.setattr(installs, "catalog", flight_catalog("0.9.0", rebook=False))
    install = services.install_plugin(tenant=world.tenant, plugin_key="flight-desk", actor=actor_for_user(owner))
    assert install.status == InstallStatus.INSTALLED and install.version == "0.9.0"

    # when the code ships 2.0.0 (a new write tool, a new scope, an outbound host) and an operator upgrades
    monkeypatch.setattr(installs, "catalog", flight_catalog("2.0.0", rebook=True, hosts=("api.airline.example",)))
    install = services.upgrade_plugin(install=install, actor=actor_for_user(world.operator))

    # then it is held; the old version keeps working and the new tool stays hidden (it does not even exist)
    assert install.status == InstallStatus.PENDING_CONSENT
    assert install.version == "0.9.0" and install.pending_plugin.version == "2.0.0"
    assert {"search_flights", "rebooking_policy"} <= names(world.tenant)
    assert "rebook_flight" not in names(world.tenant)
    assert not Tool.objects.filter(tenant=world.tenant, name="rebook_flight").exists()
    held = ConfigChange.objects.get(tenant=world.tenant, action="plugin.upgrade_pending_consent")
    assert held.details["new"] == {"scopes": ["bookings:change"], "hosts": ["api.airline.example"],
                                   "tools": ["flight_desk.rebook_flight"]}
    with pytest.raises(services.PluginNotInstalled, match="waits for an owner's consent"):
        services.create_agent_from_preset(tenant=world.tenant, plugin_key="flight-desk", preset_slug="flight-assistant",
                                          actor=actor_for_user(world.operator))

    # when the owner accepts
    install = services.accept_consent(install=install, actor=actor_for_user(owner))

    # then 2.0.0 is live with its new tool
    assert install.status == InstallStatus.INSTALLED and install.version == "2.0.0"
    assert install.granted_hosts == ["api.airline.example"]
    assert Tool.objects.get(tenant=world.tenant, name="rebook_flight").requires_approval
    assert "rebook_flight" in names(world.tenant)
    agent = services.create_agent_from_preset(tenant=world.tenant, plugin_key="flight-desk", preset_slug="flight-assistant",
                                              actor=actor_for_user(world.operator))
    assert agent.current_version.tools == ["search_flights", "rebook_flight"]


def test_an_upgrade_that_needs_nothing_new_applies_at_once_and_drops_removed_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    owner = owner_of(world.tenant)
    monkeypatch.setattr(installs, "catalog", flight_catalog("2.0.0", rebook=True))
    install = services.install_plugin(tenant=world.tenant, plugin_key="flight-desk", actor=actor_for_user(owner))

    monkeypatch.setattr(installs, "catalog", flight_catalog("2.1.0", rebook=False))
    install = services.upgrade_plugin(install=install, actor=actor_for_user(world.operator))

    assert install.status == InstallStatus.INSTALLED and install.version == "2.1.0"
    assert not Tool.objects.filter(tenant=world.tenant, name="rebook_flight").exists()
    assert ConfigChange.objects.filter(tenant=world.tenant, action="plugin.upgraded", actor=world.operator).exists()
    assert ConfigChange.objects.filter(tenant=world.tenant, action="tool.deleted", target_repr="rebook_flight").exists()
    with pytest.raises(services.MarketplaceError, match=r"already at 2\.1\.0"):
        services.upgrade_plugin(install=install, actor=actor_for_user(world.operator))


def test_disable_hides_the_tools_and_stops_preset_agents_and_uninstall_removes_them() -> None:
    world = make_world()
    owner = owner_of(world.tenant)
    install = services.install_plugin(tenant=world.tenant, plugin_key="flight-desk", actor=actor_for_user(owner))
    agent = services.create_agent_from_preset(tenant=world.tenant, plugin_key="flight-desk", preset_slug="flight-assistant",
                                              actor=actor_for_user(world.operator))
    rebook = Tool.objects.get(tenant=world.tenant, name="rebook_flight")
    assert tool_allowed_for(rebook, world.tenant.pk, "s-1") == (True, "")

    services.disable_plugin(install=install, actor=actor_for_user(world.operator))

    assert "rebook_flight" not in names(world.tenant)
    allowed, reason = tool_allowed_for(rebook, world.tenant.pk, "s-1")
    assert not allowed and "flight-desk" in reason and "not enabled" in reason
    with pytest.raises(RunRefused, match="disabled in this tenant"):
        start_run(actor=actor_for_user(world.operator), agent=agent, text="rebook ABC123")

    services.enable_plugin(install=install, actor=actor_for_user(world.operator))
    assert "rebook_flight" in names(world.tenant)
    assert start_run(actor=actor_for_user(world.operator), agent=agent, text="find flights").version == agent.current_version

    services.uninstall_plugin(install=install, actor=actor_for_user(world.operator))
    assert not PluginInstall.objects.filter(pk=install.pk).exists()
    assert not Tool.objects.filter(tenant=world.tenant, name__in=["search_flights", "rebooking_policy", "rebook_flight"]).exists()
    assert ConfigChange.objects.get(tenant=world.tenant, action="plugin.uninstalled").details["tools_removed"] == [
        "rebook_flight", "rebooking_policy", "search_flights"]
    with pytest.raises(RunRefused, match="not installed"):
        start_run(actor=actor_for_user(world.operator), agent=agent, text="find flights")


def test_a_preset_is_refused_without_the_plugin_installed() -> None:
    world = make_world()

    with pytest.raises(services.PluginNotInstalled) as refused:
        services.create_agent_from_preset(tenant=world.tenant, plugin_key="flight-desk", preset_slug="flight-assistant",
                                          actor=actor_for_user(world.operator))

    message = str(refused.value)
    assert "flight-desk" in message and "has not installed" in message and "Install the plugin first" in message
    assert not Agent.objects.filter(tenant=world.tenant, slug="flight-assistant").exists()


def test_a_preset_creates_an_agent_with_its_first_version_audited() -> None:
    world = make_world()
    owner = owner_of(world.tenant)
    services.install_plugin(tenant=world.tenant, plugin_key="order-desk", actor=actor_for_user(owner))

    agent = services.create_agent_from_preset(tenant=world.tenant, plugin_key="order-desk", preset_slug="order-desk-assistant",
                                              actor=actor_for_user(world.operator), slug="desk")

    version = agent.current_version
    assert (agent.slug, version.number, version.model) == ("desk", 1, "demo/planner")
    assert version.tools == ["query_order", "query_logistics", "sum_order_totals", "refund_order"]
    assert ConfigChange.objects.filter(action="agent.created_from_preset", actor=world.operator, target_id=str(agent.pk)).exists()
    with pytest.raises(services.MarketplaceError, match="already has an agent 'desk'"):
        services.create_agent_from_preset(tenant=world.tenant, plugin_key="order-desk", preset_slug="order-desk-assistant",
                                          actor=actor_for_user(world.operator), slug="desk")
    with pytest.raises(services.MarketplaceError, match="no preset 'nope'; its presets are: order-desk-assistant"):
        services.create_agent_from_preset(tenant=world.tenant, plugin_key="order-desk", preset_slug="nope",
                                          actor=actor_for_user(world.operator))


def test_config_is_validated_against_the_plugins_schema_naming_each_field() -> None:
    world = make_world()
    owner = owner_of(world.tenant)

    with pytest.raises(services.InvalidConfig) as invalid:
        services.install_plugin(tenant=world.tenant, plugin_key="order-desk", actor=actor_for_user(owner),
                                config={"refund_limit": -1, "colour": "red", "currency": "GBP"})

    errors = invalid.value.errors
    assert any(e.startswith("refund_limit:") and "minimum" in e for e in errors)
    assert any(e.startswith("colour: unknown setting") for e in errors)
    assert any(e.startswith("currency:") and "'GBP' is not one of" in e for e in errors)
    assert not PluginInstall.objects.filter(tenant=world.tenant).exists()

    install = services.install_plugin(tenant=world.tenant, plugin_key="order-desk",
                                      actor=actor_for_user(owner), config={"refund_limit": 100})
    assert install.config == {"refund_limit": 100, "currency": "CNY"}  # defaults filled in
    install = services.configure_plugin(install=install, config={"refund_limit": 50}, actor=actor_for_user(world.operator))
    assert ConfigChange.objects.get(action="plugin.configured").details == {"plugin": "order-desk", "changed": ["refund_limit"]}


def test_a_clashing_tool_of_the_tenant_is_not_taken_over() -> None:
    world = make_world()
    owner = owner_of(world.tenant)
    Tool.objects.create(tenant=world.tenant, name="search_flights", description="ours", kind=ToolKind.HTTP)

    with pytest.raises(services.MarketplaceError, match="already has its own tool named 'search_flights'"):
        services.install_plugin(tenant=world.tenant, plugin_key="flight-desk", actor=actor_for_user(owner))
    assert not PluginInstall.objects.filter(tenant=world.tenant).exists()


def test_another_tenants_operator_cannot_install_or_change_an_install() -> None:
    mine, theirs = make_world(), make_world()
    owner = owner_of(mine.tenant)
    install = services.install_plugin(tenant=mine.tenant, plugin_key="flight-desk", actor=actor_for_user(owner))

    with pytest.raises(NotFound):  # a foreign tenant's install is a 404, as everywhere
        services.install_plugin(tenant=mine.tenant, plugin_key="order-desk", actor=actor_for_user(theirs.operator))
    with pytest.raises(NotFound):
        services.disable_plugin(install=install, actor=actor_for_user(theirs.operator))
    with pytest.raises(services.NotAllowed):
        services.install_plugin(tenant=mine.tenant, plugin_key="order-desk", actor=actor_for_user(mine.viewer))


def test_refund_order_is_backed_by_the_demo_data() -> None:
    from marketplace.builtin import order_desk
    from tools.pyfunc import tenant_scope

    with tenant_scope(1):  # as a tenant's tool call (its refunds are that tenant's)
        result = order_desk.refund_order("O202411280002", "30.00", "damaged notebook")
        assert result["status"] == "refunded" and result["remaining_refundable"] == "58.50"
        with pytest.raises(order_desk.RefundRefused, match=r"at most 58\.50"):
            order_desk.refund_order("O202411280002", "60.00", "too much")
        with pytest.raises(order_desk.RefundRefused, match="processing"):
            order_desk.refund_order("O202411280003", "1.00", "not shipped")


def test_flight_desk_demo_data() -> None:
    from marketplace.builtin import flight_desk
    from tools.pyfunc import registry

    found = registry.call("flight_desk.search_flights", {"origin": "PEK", "destination": "SHA", "date": "2024-12-20"})
    assert [f["flight_no"] for f in found["flights"]] == ["CA1234", "CA1236", "MU5102"]
    assert registry.call("flight_desk.rebooking_policy", {"booking_ref": "LOW001"})["same_day_only"] is True
    with pytest.raises(flight_desk.FlightDeskError, match="full"):
        registry.call("flight_desk.rebook_flight", {"booking_ref": "ABC123", "new_flight_no": "CA1236", "date": "2024-12-20"})


def test_granted_scopes_are_the_tenants_live_installs_only() -> None:
    from marketplace.access import granted_scopes

    mine, theirs = make_world(), make_world()
    rows = [
        PluginInstall(tenant=mine.tenant, plugin_key="a", status=InstallStatus.INSTALLED, granted_scopes=["orders:read"]),
        PluginInstall(tenant=mine.tenant, plugin_key="b", status=InstallStatus.PENDING_CONSENT, granted_scopes=["x:y", "z:w"]),
        PluginInstall(tenant=mine.tenant, plugin_key="c", status=InstallStatus.DISABLED, granted_scopes=["gone:scope"]),
        PluginInstall(tenant=theirs.tenant, plugin_key="a", status=InstallStatus.INSTALLED, granted_scopes=["orders:refund"]),
    ]
    PluginInstall.objects.bulk_create(rows)
    assert sorted(granted_scopes(mine.tenant.pk)) == ["orders:read", "x:y", "z:w"]
    assert granted_scopes(theirs.tenant.pk) == ["orders:refund"]
    assert granted_scopes(10**9) == []
