"""``manage.py import_mcp_tools``: import (or refresh) an MCP server's tools as a tenant's tools of kind ``mcp``."""

from __future__ import annotations

import json
import shlex
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.remote_waits import RemoteCallsBusy
from tenants.models import Tenant
from tools.mcp_import import McpServerError, import_mcp_tools


class Command(BaseCommand):
    help = (
        "Import the tools of an MCP server into a tenant: a stdio server started with --command "
        '(e.g. "python -m mcp_server_time"; it must be on the MCP_STDIO_COMMANDS allow-list) or an HTTP '
        "server at --url (streamable HTTP, or --transport sse). Existing tools of the same server are refreshed; "
        "a name taken by another tool is skipped (use --prefix)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant's slug.")
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--command", dest="server_command", help='The stdio server\'s command line, e.g. "python -m mcp_server_time".')
        source.add_argument("--url", help="The HTTP server's endpoint, e.g. https://mcp.example.com/mcp.")
        parser.add_argument("--transport", choices=["streamable_http", "sse"], default="streamable_http")
        parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                            help="Environment for a stdio server (repeatable); a value may be secret:NAME.")
        parser.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                            help="A header for an HTTP server (repeatable); a value may be secret:NAME.")
        parser.add_argument("--prefix", default="", help="Put before each imported tool's name, e.g. time_.")
        parser.add_argument("--tool", action="append", dest="only", help="Import only this tool (repeatable).")
        parser.add_argument("--timeout", type=float, help="Seconds to wait for the server (default 20).")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            known = ", ".join(Tenant.objects.values_list("slug", flat=True)[:20]) or "none"
            raise CommandError(f"No tenant {options['tenant']!r}. Known: {known}.")
        server: dict[str, Any]
        if options["server_command"]:
            server = {"command": shlex.split(options["server_command"])}
            if options["env"]:
                server["env"] = _pairs(options["env"], "--env")
        else:
            server = {"url": options["url"]}
            if options["transport"] != "streamable_http":
                server["transport"] = options["transport"]
            if options["header"]:
                server["headers"] = _pairs(options["header"], "--header")
        if options["timeout"] is not None:
            server["timeout"] = options["timeout"]
        try:
            report = import_mcp_tools(tenant, server, None, prefix=options["prefix"], only=options["only"])
        except (McpServerError, RemoteCallsBusy) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"created: {', '.join(report.created) or '-'}")
        self.stdout.write(f"updated: {', '.join(report.updated) or '-'}")
        for name, why in report.skipped:
            self.stdout.write(f"skipped {name}: {why}")
        if report.stale:
            self.stdout.write(f"no longer listed by the server (left as they are): {', '.join(report.stale)}")
        if options["verbosity"] > 1:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CommandError(f"{flag} takes NAME=VALUE; got {item!r}.")
        pairs[name] = value
    return pairs
