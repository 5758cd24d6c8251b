"""Built-in plugins. Each module registers its Python tools on import and exposes a ``PLUGIN`` spec."""

from __future__ import annotations

from marketplace.catalog import PluginCatalog, PluginSpec


def builtin_plugins() -> list[PluginSpec]:
    from marketplace.builtin import flight_desk, order_desk

    return [order_desk.PLUGIN, flight_desk.PLUGIN]


def register_builtins(catalog: PluginCatalog) -> None:
    for spec in builtin_plugins():
        catalog.register(spec)
