"""Kind ``mcp``: a tool of an MCP server (``config = {"server": {...}, "tool": "<name on the server>"}``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator

from runtime.documents import json_object, problems_of, text
from tools.executors import ExecContext
from tools.kinds.base import Kind, ToolConfig, read_config, saving, secret_problems
from tools.mcp_import import call_mcp_tool, server_problems
from tools.models import Tool

SERVER_EXAMPLE = '{"command": ["python", "-m", "mcp_server_time"]} or {"url": "https://..."}'


class McpConfig(ToolConfig):
    """A tool of an MCP server: the server (stdio command or URL) and the tool's name there."""

    server: Annotated[dict[str, Any], json_object(f"must be an object such as {SERVER_EXAMPLE}"),
                      Field(description=f"the MCP server, e.g. {SERVER_EXAMPLE}")]
    tool: Annotated[str, text(nullable=False), Field(description="the tool's name on the MCP server")]

    @field_validator("server")
    @classmethod
    def _usable(cls, server: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        context = saving(info)
        found = server_problems(server)
        if context is not None:
            found += secret_problems(server.get("headers"), context["tenant"]) + secret_problems(server.get("env"), context["tenant"])
        if found:
            raise problems_of(f"$: {message}" for message in found)
        return server


def execute(tool: Tool, arguments: dict[str, Any], ctx: ExecContext) -> Any:
    """One session per call; a stored config that no longer parses is a failure the model reads."""
    config = read_config(McpConfig, tool)
    return call_mcp_tool(tool, config.server, config.tool, arguments, ctx)


#: An MCP server needs longer than a function.
KIND = Kind(name="mcp", execute=execute, config_model=McpConfig, default_timeout=30.0)
