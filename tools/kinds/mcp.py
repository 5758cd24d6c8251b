"""Kind ``mcp``: a tool of an MCP server (``config = {"server": {...}, "tool": "<name on the server>"}``)."""

from __future__ import annotations

from typing import Any

from tools.kinds.base import AddProblem, Kind, secret_problems
from tools.mcp_import import run_mcp, server_problems


def check(config: dict[str, Any], parameters: dict[str, Any], tenant: Any, add: AddProblem) -> None:
    server = config.get("server")
    for message in server_problems(server):
        add("server", message)
    if isinstance(server, dict):
        for message in secret_problems(server.get("headers"), tenant) + secret_problems(server.get("env"), tenant):
            add("server", message)
    if not isinstance(config.get("tool"), str) or not config.get("tool"):
        add("tool", "must be the tool's name on the MCP server")


#: An MCP server needs longer than a function.
KIND = Kind(name="mcp", execute=run_mcp, check=check, default_timeout=30.0)
