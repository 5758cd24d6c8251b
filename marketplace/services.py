"""The marketplace's services, by concern: plugin installs (:mod:`marketplace.installs`), gradual release and tool
rollouts (:mod:`marketplace.rollouts`), the release gate (:mod:`marketplace.gate`), and their refusals (:mod:`marketplace.errors`).

Callers (API, admin, tasks, commands) import them from here. Every service takes keyword arguments and an explicit
``actor`` (an :class:`~tenants.scoping.Actor`; ``None`` is the platform), checks the actor's role, runs in one
transaction and writes its audit row in it.
"""

from __future__ import annotations

from marketplace.errors import InvalidConfig, InvalidWeights, MarketplaceError, NotAllowed, PluginNotInstalled
from marketplace.gate import GateRefused, set_release_gate
from marketplace.installs import (
    accept_consent,
    config_errors,
    configure_plugin,
    create_agent_from_preset,
    disable_plugin,
    enable_plugin,
    install_plugin,
    plugin_row,
    uninstall_plugin,
    upgrade_plugin,
    validated_config,
)
from marketplace.rollouts import (
    ERROR_REASONS,
    GuardTrip,
    check_release_gate,
    check_release_guards,
    guard_value,
    rollback_version,
    set_release_guard,
    set_release_weights,
    set_tool_rollout,
)

__all__ = [
    "ERROR_REASONS", "GateRefused", "GuardTrip", "InvalidConfig", "InvalidWeights", "MarketplaceError", "NotAllowed", "PluginNotInstalled",
    "accept_consent", "check_release_gate", "check_release_guards", "config_errors", "configure_plugin", "create_agent_from_preset",
    "disable_plugin", "enable_plugin", "guard_value", "install_plugin", "plugin_row", "rollback_version",
    "set_release_gate", "set_release_guard", "set_release_weights", "set_tool_rollout", "uninstall_plugin", "upgrade_plugin",
    "validated_config",
]
