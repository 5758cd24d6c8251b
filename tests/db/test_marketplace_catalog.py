"""The plugin catalog: declared in code (built-ins and entry points), frozen, mirrored to the database."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from audit.models import ConfigChange
from marketplace.catalog import (
    TOOL_OVERRIDE_FIELDS,
    AgentPreset,
    CatalogFrozenError,
    PluginCatalog,
    PluginDeclarationError,
    PluginSpec,
    PluginTool,
    ToolOverrides,
    catalog,
    python_tools,
)
from marketplace.models import Plugin
from marketplace.sync import sync_catalog

FIXTURE_SITE = Path(__file__).resolve().parents[1] / "fixtures" / "plugins"


@pytest.fixture
def example_package_on_path() -> Iterator[None]:
    """The example plugin package, as if pip-installed: its dist-info is found by importlib.metadata."""
    sys.path.insert(0, str(FIXTURE_SITE))
    try:
        yield
    finally:
        sys.path.remove(str(FIXTURE_SITE))


def test_builtin_plugins_are_in_the_frozen_catalog() -> None:
    assert {"order-desk", "flight-desk"} <= {spec.key for spec in catalog}
    assert catalog.frozen
    with pytest.raises(CatalogFrozenError, match="frozen"):
        catalog.register(PluginSpec(key="late-comer", name="Late", version="1.0.0"))
    refund = next(t for t in catalog.get("order-desk").tools if t.key == "order_desk.refund_order")
    assert refund.requires_approval
    rebook = next(t for t in catalog.get("flight-desk").tools if t.key == "flight_desk.rebook_flight")
    assert rebook.requires_approval


@pytest.mark.django_db
def test_migrate_synced_the_builtin_plugins() -> None:
    # post_migrate ran sync_plugins when the test database was created.
    rows = {(p.key, p.version) for p in Plugin.objects.filter(available=True)}
    assert ("order-desk", catalog.get("order-desk").version) in rows
    assert ("flight-desk", catalog.get("flight-desk").version) in rows
    order_desk = Plugin.objects.get(key="order-desk", available=True)
    refund = next(t for t in order_desk.tools if t["key"] == "order_desk.refund_order")
    assert refund == {"key": "order_desk.refund_order", "name": "refund_order", "category": "write", "requires_approval": True,
                      "overrides": {"required_scopes": ["orders:refund"], "sensitive_fields": ["reason"]}}
    assert order_desk.preset("order-desk-assistant")["tools"] == ["query_order", "query_logistics", "sum_order_totals", "refund_order"]


@pytest.mark.django_db
def test_an_entry_point_of_an_installed_package_is_synced(example_package_on_path: None) -> None:
    # given a catalog that loads the agentops.plugins entry points
    plugins = PluginCatalog()
    loaded = plugins.load_entry_points()
    plugins.freeze()

    # then the example package's plugin is in it, marked with its distribution
    assert [spec.key for spec in loaded] == ["weather-desk"]
    assert plugins.get("weather-desk").source == "entry_point:agentops-plugin-example"
    assert plugins.load_errors == []

    # when it is synced to the database
    report = sync_catalog(plugins=plugins, retire_missing=False)

    # then a read-only Plugin row mirrors the declaration, and the sync is audited
    assert report.created == ["weather-desk 0.1.0"]
    row = Plugin.objects.get(key="weather-desk", version="0.1.0")
    assert row.hosts == ["api.weather.example"] and row.scopes == ["weather:read"]
    assert row.tool_names() == ["forecast"]
    assert ConfigChange.objects.filter(action="plugin.catalog_synced", details__created=["weather-desk 0.1.0"]).exists()

    # and a second sync changes nothing
    again = sync_catalog(plugins=plugins, retire_missing=False)
    assert again.unchanged == ["weather-desk 0.1.0"] and not again.changed


@pytest.mark.django_db
def test_sync_retires_what_the_code_no_longer_provides(example_package_on_path: None) -> None:
    plugins = PluginCatalog()
    plugins.load_entry_points()
    sync_catalog(plugins=plugins, retire_missing=False)

    call_command("sync_plugins")  # the process catalog has no weather-desk

    assert not Plugin.objects.get(key="weather-desk").available
    assert Plugin.objects.get(key="order-desk", version=catalog.get("order-desk").version).available


def test_a_broken_entry_point_is_reported_not_fatal(tmp_path: Path) -> None:
    dist = tmp_path / "broken_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[agentops.plugins]\nbroken = no_such_module_xyz:PLUGIN\n")
    sys.path.insert(0, str(tmp_path))
    try:
        plugins = PluginCatalog()
        assert plugins.load_entry_points() == []
    finally:
        sys.path.remove(str(tmp_path))
    assert plugins.load_errors and "broken" in plugins.load_errors[0][0]


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"key": "Bad_Key"}, r"plugin 'Bad_Key': key: must be lower-case letters, digits and '-'"),
        ({"version": "one"}, r"plugin 'x': version: must look like 1.2.0, got 'one'"),
        ({"tools": (PluginTool("nope.nothing"),)}, r"plugin 'x': tools\[0\].key: 'nope.nothing' is not a registered Python tool"),
        ({"tools": ({"key": "order_desk.query_order", "overrides": {"enabled": False}},)},
         r"plugin 'x': tools\[0\].overrides.enabled: unknown field; expected one of \['category'"),
        ({"scopes": ("a:b",), "requires_install": False},
         r"plugin 'x': requires_install: a plugin that needs scopes .* must require an install"),
        ({"config_schema": {"type": "nonsense"}}, r"plugin 'x': config_schema: not a valid JSON Schema"),
    ],
)
def test_declaration_errors_name_the_problem_and_its_path(declared: dict[str, Any], message: str) -> None:
    with pytest.raises(PluginDeclarationError, match=message):
        PluginCatalog().register(PluginSpec(**{"key": "x", "name": "x", "version": "1.0.0", **declared}))


def test_a_declaration_lists_every_problem_at_once_with_its_path() -> None:
    with pytest.raises(PluginDeclarationError) as made:
        PluginSpec(key="Bad_Key", name="", version="one", config_schema={"type": "nonsense"},
                   tools=[{"key": "order_desk.query_order", "overrides": {"rate_limit_per_minute": 0, "colour": 1}}],
                   presets=[{"slug": "a", "name": "A", "system_prompt": "s", "model": "demo/planner"}] * 2)
    assert made.value.errors == [
        "key: must be lower-case letters, digits and '-' (e.g. 'order-desk'), got 'Bad_Key'",
        "name: must be a non-empty string, got ''",
        "version: must look like 1.2.0, got 'one'",
        "tools[0].overrides.rate_limit_per_minute: Must be a whole number of calls per minute from 1 to 100000, or empty "
        "for no limit; got 0.",
        "tools[0].overrides.colour: unknown field; expected one of ['category', 'description', 'idempotent', "
        "'rate_limit_per_minute', 'required_scopes', 'result_fields', 'result_size_cap', 'sensitive_fields', "
        "'summary_template', 'timeout_seconds']",
        "presets[1].slug: 'a' is declared twice",
        "config_schema: not a valid JSON Schema: 'nonsense' is not valid under any of the given schemas",
    ]
    spec = PluginSpec(key="x", name="x", version="1.0.0",
                      tools=(PluginTool("nope.nothing"), PluginTool("order_desk.query_order"), PluginTool("order_desk.query_order")),
                      presets=(AgentPreset(slug="a", name="A", system_prompt="s", model="demo/planner", tools=("ghost",)),))
    with pytest.raises(PluginDeclarationError) as registered:
        PluginCatalog().register(spec)
    assert registered.value.errors == [
        "tools[0].key: 'nope.nothing' is not a registered Python tool (missing @tool?)",
        "tools[2]: tools 'order_desk.query_order' and 'order_desk.query_order' are both named 'query_order'",
        "presets[0].tools: names tool(s) ghost the plugin does not provide; its tools are query_order",
    ]


def test_overrides_are_a_typed_document_and_the_row_keeps_only_what_was_declared() -> None:
    tool = PluginTool("order_desk.refund_order", requires_approval=True,
                      overrides={"required_scopes": ["orders:refund"], "timeout_seconds": 5, "rate_limit_per_minute": 30})
    assert tool.overrides.timeout_seconds == 5 and tool.overrides.category is None and tool.overrides.idempotent is None
    row = tool.as_json(python_tools)
    assert row["overrides"] == {"required_scopes": ["orders:refund"], "timeout_seconds": 5, "rate_limit_per_minute": 30}
    assert row["category"] == "write"  # the function's own, not overridden
    assert set(ToolOverrides.model_fields) == TOOL_OVERRIDE_FIELDS
    with pytest.raises(PluginDeclarationError, match=r"plugin tool 'k': overrides.category: must be one of \['read', 'write'\], "
                                                     r"got 'sideways'; overrides.timeout_seconds: must be a number above 0 "
                                                     r"and at most 600, got 0"):
        PluginTool("k", overrides={"timeout_seconds": 0, "category": "sideways"})
    schema = PluginSpec.model_json_schema()
    assert schema["$defs"]["ToolOverrides"]["properties"]["rate_limit_per_minute"]["anyOf"][0]["maximum"] == 100_000
