"""Tool kinds: one module each, one table, and the table and the column's choices name the same kinds."""

from __future__ import annotations

import pytest
from django.conf import settings

from tools.executors import ToolFailure
from tools.gateway import _duplicate_window
from tools.kinds import KINDS, config_help, config_schemas, executor_for, kind_for
from tools.kinds.base import read_config
from tools.kinds.http import HttpConfig, spec
from tools.kinds.python import PythonConfig
from tools.models import Tool, ToolKind


def test_every_kind_of_the_column_has_its_module_in_the_table_and_no_other() -> None:
    assert set(KINDS) == set(ToolKind.values)
    for name, kind in KINDS.items():
        assert kind.name == name and callable(kind.execute) and callable(kind.check)
        assert kind.__class__.__module__ == "tools.kinds.base"


def test_an_unknown_kind_is_a_failure_the_model_reads() -> None:
    assert kind_for("carrier-pigeon") is None
    try:
        executor_for("carrier-pigeon")
    except ToolFailure as exc:
        assert exc.status == "error" and "carrier-pigeon" in str(exc)
    else:
        raise AssertionError("an unknown kind must not be executable")


def test_each_kinds_own_checks_run_through_the_table() -> None:
    problems: list[tuple[str, str]] = []
    KINDS["http"].check({"method": "FETCH", "url": "https://api.example.com/o/{order}"}, {"properties": {}}, None,
                        lambda key, message: problems.append((key, message)))
    assert ("method", "must be one of GET, POST, PUT, PATCH, DELETE, got 'FETCH'") in problems
    assert any(key == "url" and "{order}" in message for key, message in problems)
    assert KINDS["agent"].default_parameters is not None and KINDS["mcp"].default_timeout == 30.0


def test_every_problem_of_an_http_config_is_reported_at_once_by_key() -> None:
    config = {"method": "FETCH", "url": "https://api.example.com/o/{order}/{line}", "query_params": ["nope", "q"],
              "body": "xml", "headers": {"X-Key": 3}, "allow_hosts": ["10.0.4.0/24:0"], "colour": "red"}
    found = KINDS["http"].problems(config, {"properties": {"q": {"type": "string"}}}, None)
    assert found == {
        "method": ["must be one of GET, POST, PUT, PATCH, DELETE, got 'FETCH'"],
        "url": ["the placeholder {order} is not a parameter of the tool; add it to parameters.properties",
                "the placeholder {line} is not a parameter of the tool; add it to parameters.properties"],
        "query_params": ["'nope' is not a parameter of the tool"],
        "body": ["must be one of ['json', 'none'], got 'xml'"],
        "headers": ['must be an object of strings; a secret is written "secret:NAME" or "Bearer {secret:NAME}", got dict'],
        "allow_hosts": ["'10.0.4.0/24:0': the port must be a number from 1 to 65535, got '0'"],
        "colour": ["unknown field; expected one of ['allow_hosts', 'body', 'duplicate_window_seconds', 'headers', 'method', "
                   "'query_params', 'timeout', 'url']"],
    }
    assert KINDS["http"].problems({}, {}, None) == {"url": ["is required (the endpoint, e.g. https://api.example.com/orders/{order_id})"]}
    assert KINDS["mcp"].problems({"server": {"url": "https://mcp.example.com/mcp"}}, {}, None) == {
        "tool": ["is required (the tool's name on the MCP server)"]}
    assert KINDS["agent"].problems({"agent": ""}, {}, None) == {"agent": ["must be a non-empty string, got ''"]}


def test_spec_reads_the_typed_config_with_its_defaults_and_a_broken_one_is_a_failure() -> None:
    tool = Tool(name="t", kind="http", timeout_seconds=7, config={"url": "https://api.example.com/o/{id}", "method": "post"})
    http = spec(tool)
    assert (http.method, http.body, http.query_params, http.headers, http.timeout) == ("POST", "json", [], {}, 7.0)
    assert read_config(HttpConfig, tool).allow_hosts == []
    broken = Tool(name="t", kind="http", config={"url": "ftp://x"})
    with pytest.raises(ToolFailure, match=r"The tool t is misconfigured \(url: url_template must be an absolute http\(s\) URL"):
        spec(broken)
    config = read_config(PythonConfig, Tool(name="p", kind="python", config={"function": "any.key"}))
    assert config.isolation == "thread"  # registration is checked when the tool is saved; the registry says it at call time


def test_each_kinds_config_schema_is_exported() -> None:
    schemas = config_schemas()
    assert set(schemas) == set(KINDS)
    http = schemas["http"]
    assert http["required"] == ["url"] and http["additionalProperties"] is False
    assert http["properties"]["method"]["enum"] == ["GET", "POST", "PUT", "PATCH", "DELETE"]
    assert http["properties"]["body"]["default"] == "json"
    assert schemas["python"]["properties"]["isolation"]["enum"] == ["thread", "process"]
    assert schemas["mcp"]["required"] == ["server", "tool"] and schemas["agent"]["required"] == ["agent"]
    assert 'http: method = "GET", url (required), query_params = [], body = "json"' in config_help()


def test_mcp_and_the_duplicate_window_read_the_typed_config() -> None:
    broken = Tool(name="m", kind="mcp", config={"server": {"url": "ftp://x"}, "tool": "now"})
    with pytest.raises(ToolFailure, match=r"The tool m is misconfigured \(server: \"url\" must be an absolute http\(s\) URL"):
        KINDS["mcp"].execute(broken, {}, None)  # type: ignore[arg-type]
    python = {"function": "order_desk.refund_order"}
    assert _duplicate_window(Tool(name="w", kind="python", config={**python, "duplicate_window_seconds": 5})) == 5
    assert _duplicate_window(Tool(name="w", kind="python", config=python)) == settings.TOOL_DUPLICATE_WINDOW_SECONDS
    assert _duplicate_window(Tool(name="w", kind="python", config={**python, "duplicate_window_seconds": -1})) == (
        settings.TOOL_DUPLICATE_WINDOW_SECONDS), "a config that does not parse falls back to the setting"
