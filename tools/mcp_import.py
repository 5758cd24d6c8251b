"""MCP tools: import a server's tools as Tool rows of kind ``mcp``, and call them.

A server is described by a small dict, stored in each imported tool's ``config["server"]``::

    {"command": ["python", "-m", "mcp_server_time"], "env": {"TZ": "Europe/Paris"}}   # stdio
    {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer {secret:MCP}"}}   # streamable HTTP
    {"url": "https://mcp.example.com/sse", "transport": "sse"}                          # legacy SSE

A stdio server is a program the worker starts, so only commands on the operator allow-list
(``settings.MCP_STDIO_COMMANDS``: a list of command prefixes, default: the reference time
server) may be imported or run; anything else would let a tenant run programs on the worker.
An HTTP server goes through the same egress guard as HTTP tools (no private or metadata
addresses unless allow-listed), checked before any secret is resolved and again for the very
connection (the client connects to the address it validated, so a name cannot be rebound to
loopback in between). Until the server has completed the MCP handshake, a failure is described by
its kind and HTTP status only: nothing the target answered is echoed. Header and env values may name secrets (``secret:NAME`` or
``{secret:NAME}``), resolved from ``TOOL_SECRET_<NAME>`` only when the call is made.

Naming: an imported tool keeps the server's name unless a ``prefix`` is given (``time_`` turns
``get_current_time`` into ``time_get_current_time``). A name already taken in the tenant by a
tool that is not this server's tool of the same name is never overwritten: it is reported as
skipped, and the operator re-imports with a prefix. Re-importing refreshes the description and
schema of the server's tools; tools the server no longer lists are reported as stale (not deleted).

Each call opens its own session (spawn or connect, initialise, call, close). The gateway runs
executors in a worker thread; the async client runs there with ``anyio.run``.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from audit.services import record_change
from core.remote_waits import remote_wait
from egress.async_guard import guarded_async_client
from egress.guard import TENANT_ANSWER_BYTES, EgressDenied, allow_list_problems, check_url
from tenants.scoping import Actor, acting
from tools.executors import ExecContext, ToolFailure, resolve_secret
from tools.models import Tool, ToolCategory, ToolKind

T = TypeVar("T")

#: Commands (prefixes) a stdio MCP server may be started with, unless settings say otherwise.
DEFAULT_STDIO_COMMANDS: list[list[str]] = [["python", "-m", "mcp_server_time"], ["mcp-server-time"]]
#: Seconds to wait for the server to start and answer one request.
DEFAULT_TIMEOUT = 20.0
#: Pages of tools/list read at most (a server that pages forever cannot hang an import).
MAX_LIST_PAGES = 50
#: What one session with a tenant's MCP server over HTTP (one import, one tool call) may receive (egress's bound).
MAX_RESPONSE_BYTES = TENANT_ANSWER_BYTES
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SECRET_WHOLE = re.compile(r"^\s*secret:([A-Za-z0-9_.\-/]+)\s*$")
_SECRET_INLINE = re.compile(r"\{secret:([A-Za-z0-9_.\-/]+)\}")
_PYTHON_NAMES = {"python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"}
SERVER_KEYS = ("command", "url", "env", "headers", "transport", "timeout", "allow_hosts")
#: Environment a stdio server may not be given: it would change which code the allowed command runs.
_UNSAFE_ENV = re.compile(r"^(PYTHON|LD_|DYLD_)|^(PATH|HOME|NODE_OPTIONS|NODE_PATH)$", re.I)


class McpServerError(Exception):
    """The server could not be reached, started or understood; the message says what to fix."""

    def __init__(self, message: str, *, status: str = "error") -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    #: (name, why) for tools not imported.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: Tools imported earlier from this server that it no longer lists (left as they are).
    stale: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"created": self.created, "updated": self.updated,
                "skipped": [{"name": n, "reason": r} for n, r in self.skipped], "stale": self.stale}


# --------------------------------------------------------------------------- server descriptions


def stdio_allow_list() -> list[list[str]]:
    configured = getattr(settings, "MCP_STDIO_COMMANDS", None)
    return [list(map(str, c)) for c in (configured if configured is not None else DEFAULT_STDIO_COMMANDS)]


def _command_allowed(command: list[str]) -> bool:
    normalised = ["python" if i == 0 and part in _PYTHON_NAMES | {sys.executable} else part for i, part in enumerate(command)]
    return any(normalised[: len(prefix)] == prefix for prefix in stdio_allow_list() if prefix)


def server_problems(server: Any) -> list[str]:
    """What is wrong with a server description (empty when it is usable)."""
    if not isinstance(server, dict):
        return ['must be an object such as {"command": ["python", "-m", "mcp_server_time"]} or {"url": "https://..."}']
    command, url = server.get("command"), server.get("url")
    if (command is None) == (url is None):
        return ['give exactly one of "command" (a stdio server) or "url" (an HTTP server)']
    problems: list[str] = []
    if command is not None:
        if isinstance(command, str):
            command = command.split()
        if not isinstance(command, list) or not command or not all(isinstance(p, str) and p for p in command):
            problems.append('"command" must be a non-empty list of strings, e.g. ["python", "-m", "mcp_server_time"]')
        elif not _command_allowed(command):
            allowed = "; ".join(" ".join(p) for p in stdio_allow_list()) or "none"
            problems.append(f"the command {' '.join(command)!r} is not on the MCP_STDIO_COMMANDS allow-list "
                            f"(allowed: {allowed}); a server administrator must add it")
        env = server.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            problems.append('"env" must be an object of strings')
        else:
            unsafe = sorted(k for k in env if _UNSAFE_ENV.search(k))
            if unsafe:
                problems.append(f'"env" may not set {", ".join(unsafe)}: it would change what the allowed command runs')
    else:
        parts = urlsplit(str(url))
        if not isinstance(url, str) or parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f'"url" must be an absolute http(s) URL, got {url!r}')
        if server.get("transport", "streamable_http") not in ("streamable_http", "sse"):
            problems.append('"transport" must be "streamable_http" (the default) or "sse"')
        headers = server.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            problems.append('"headers" must be an object of strings')
    problems.extend(f'"allow_hosts": {problem}' for problem in allow_list_problems(server.get("allow_hosts", [])))
    timeout = server.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 600:
        problems.append('"timeout" must be a number of seconds between 0 and 600')
    unknown = sorted(set(server) - set(SERVER_KEYS))
    if unknown:
        problems.append(f"unknown keys: {', '.join(unknown)}")
    return problems


def normalize_server(server: dict[str, Any]) -> dict[str, Any]:
    """The stored form: ``command`` always a list; only the keys that matter."""
    problems = server_problems(server)
    if problems:
        raise McpServerError("The MCP server description is not usable: " + "; ".join(problems) + ".")
    out = {k: v for k, v in server.items() if k in SERVER_KEYS}
    if isinstance(out.get("command"), str):
        out["command"] = out["command"].split()
    return out


def server_identity(server: dict[str, Any]) -> str:
    """What makes two descriptions the same server: the command or the URL."""
    if server.get("command") is not None:
        command = server["command"].split() if isinstance(server["command"], str) else list(server["command"])
        return "stdio:" + json.dumps(command)
    return "url:" + str(server.get("url", "")).rstrip("/")


def _resolve_secrets(values: dict[str, str]) -> dict[str, str]:
    from tools.http_exec import SecretUnavailable

    resolved: dict[str, str] = {}
    try:
        for key, value in values.items():
            whole = _SECRET_WHOLE.match(value)
            resolved[key] = resolve_secret(whole.group(1)) if whole else _SECRET_INLINE.sub(lambda m: resolve_secret(m.group(1)), value)
    except SecretUnavailable as exc:
        raise McpServerError(str(exc)) from None
    return resolved


# --------------------------------------------------------------------------- talking to a server


def _run_async(fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn`` to completion from synchronous code (in a fresh thread if this one has a loop)."""
    import anyio

    try:
        import asyncio

        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(fn)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcp") as pool:
        return pool.submit(anyio.run, fn).result()


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _describe(exc: BaseException) -> str:
    leaves = _leaves(exc)
    from mcp.shared.exceptions import MCPError

    for leaf in leaves:  # the server's own words first
        if isinstance(leaf, MCPError):
            return str(leaf)
    leaf = leaves[0]
    if isinstance(leaf, TimeoutError):
        return "the server did not answer in time"
    return f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__


def _describe_unproven(exc: BaseException) -> str:
    """A failure before the MCP handshake: its kind and HTTP status, never the target's words."""
    import httpx2
    from mcp.shared.exceptions import MCPError

    leaf = _leaves(exc)[0]
    if isinstance(leaf, TimeoutError):
        return "the server did not answer in time"
    status = getattr(getattr(leaf, "response", None), "status_code", None)
    if isinstance(status, int):
        return f"it answered HTTP {status} and did not complete the MCP handshake"
    if isinstance(leaf, MCPError):
        return "it did not complete the MCP handshake (its answer is not shown); check that the URL is an MCP endpoint"
    if isinstance(leaf, httpx2.SSEError):
        return "it did not answer with an event stream (text/event-stream); check the URL and the transport"
    if isinstance(leaf, httpx2.TransportError):
        return f"it could not be reached ({type(leaf).__name__})"
    return f"it did not complete the MCP handshake ({type(leaf).__name__}; its answer is not shown)"


def _stderr_tail(errlog: Any) -> str:
    try:
        errlog.seek(0)
        lines = [line.rstrip() for line in errlog.read().splitlines() if line.strip()]
    except (OSError, ValueError):
        return ""
    return " | ".join(lines[-3:])[-500:]


def with_session(server: dict[str, Any], work: Callable[[Any], Awaitable[T]], *, allow: Iterable[str] = ()) -> T:
    """Connect to ``server``, run ``work(client)`` and close; failures become :class:`McpServerError`."""
    server = normalize_server(server)
    timeout = float(server.get("timeout", DEFAULT_TIMEOUT))
    from mcp import Client, StdioServerParameters

    if server.get("url"):
        policy = [*settings.TOOL_EGRESS_ALLOW, *allow, *server.get("allow_hosts", [])]
        try:
            check_url(server["url"], allow=policy)
        except EgressDenied as exc:
            raise McpServerError(f"the MCP server was not contacted: {exc.reason}", status="egress_denied") from None
        headers = _resolve_secrets(server.get("headers", {}))

        def pinned_client(headers: dict[str, str] | None = None, timeout: Any = None, auth: Any = None) -> Any:
            return guarded_async_client(allow=policy, headers=headers, timeout=timeout, auth=auth,
                                        max_response_bytes=MAX_RESPONSE_BYTES)

        if server.get("transport") == "sse":
            from mcp.client.sse import sse_client

            transport: Any = sse_client(server["url"], headers=headers, timeout=timeout, httpx_client_factory=pinned_client)
        else:
            from mcp.client.streamable_http import streamable_http_client

            transport = streamable_http_client(server["url"], http_client=pinned_client(headers=headers, timeout=timeout))
        handshake: list[bool] = []

        async def main_http() -> T:
            async with Client(transport, read_timeout_seconds=timeout, cache=None) as session:
                handshake.append(True)
                return await work(session)

        try:
            return _run_async(main_http)
        except (Exception, BaseExceptionGroup) as exc:  # every failure is reported in words
            denied = next((leaf for leaf in _leaves(exc) if isinstance(leaf, EgressDenied)), None)
            if denied is not None:
                raise McpServerError(f"the MCP server was not contacted: {denied.reason}", status="egress_denied") from None
            said = _describe(exc) if handshake else _describe_unproven(exc)
            raise McpServerError(f"the MCP server at {server['url']} failed: {said}") from None

    from mcp.client.stdio import stdio_client

    command = list(server["command"])
    executable = sys.executable if command[0] in _PYTHON_NAMES else command[0]
    params = StdioServerParameters(command=executable, args=command[1:], env=_resolve_secrets(server.get("env", {})) or None)
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as errlog:

        async def main_stdio() -> T:
            import anyio

            with anyio.fail_after(timeout * 2):
                async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=timeout, cache=None) as session:
                    return await work(session)

        try:
            return _run_async(main_stdio)
        except (Exception, BaseExceptionGroup) as exc:  # every failure is reported in words
            tail = _stderr_tail(errlog)
            where = f"the MCP server {' '.join(command)!r}"
            raise McpServerError(f"{where} failed: {_describe(exc)}" + (f" (its last words: {tail})" if tail else "")) from None


def list_server_tools(server: dict[str, Any]) -> list[Any]:
    """Every tool the server lists (all pages)."""

    async def work(client: Any) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    return with_session(server, work)


def render_content(result: Any) -> Any:
    """Structured content when the server gives it; else the text parts joined (other parts named)."""
    if getattr(result, "structured_content", None) is not None and not result.is_error:
        return result.structured_content
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {getattr(block, 'mime_type', '')}, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource {getattr(block, 'uri', '')}]")
        elif kind == "resource":
            resource = getattr(block, "resource", None)
            parts.append(getattr(resource, "text", None) or f"[resource {getattr(resource, 'uri', '')}]")
        else:
            parts.append(f"[{kind or 'unknown'} content]")
    text = "\n".join(p for p in parts if p)
    if not result.is_error:
        try:  # a JSON text part is handed on as data, so shaping can whitelist its fields
            return json.loads(text) if text.lstrip().startswith(("{", "[")) else text
        except ValueError:
            return text
    return text


def call_mcp_tool(tool: Tool, server: dict[str, Any], name: str, arguments: dict[str, Any], ctx: ExecContext) -> Any:
    """Call ``name`` on ``server`` (a checked description: the kind's config document), one session per call."""
    server = {**server, "timeout": min(float(server.get("timeout", DEFAULT_TIMEOUT)), float(tool.timeout_seconds))}

    async def work(client: Any) -> Any:
        return await client.call_tool(name, arguments)

    try:
        result = with_session(server, work, allow=ctx.egress_allow)
    except McpServerError as exc:
        raise ToolFailure(exc.status, f"The tool {tool.name} could not be called: {exc}. No result was obtained.") from None
    content = render_content(result)
    if result.is_error:
        raise ToolFailure("error", f"The tool {tool.name} reported an error: {content or 'no details given'}")
    return content


# --------------------------------------------------------------------------- the import service


def tool_name_for(original: str, prefix: str = "") -> str:
    name = re.sub(r"[^A-Za-z0-9_-]", "_", f"{prefix}{original}")
    return name[:64]


def _defaults(spec: Any, server: dict[str, Any]) -> dict[str, Any]:
    annotations = getattr(spec, "annotations", None)
    read_only = bool(annotations and annotations.read_only_hint)
    idempotent = bool(annotations and (annotations.idempotent_hint or annotations.read_only_hint))
    schema = dict(spec.input_schema or {"type": "object", "properties": {}})
    return {
        "description": (spec.description or getattr(spec, "title", None) or spec.name).strip(),
        "kind": ToolKind.MCP,
        "parameters": schema,
        "output_schema": dict(spec.output_schema or {}),
        "config": {"server": server, "tool": spec.name},
        "category": ToolCategory.READ if read_only else ToolCategory.WRITE,
        "idempotent": idempotent,
    }


def import_mcp_tools(tenant: Any, server: dict[str, Any], actor: Actor | None, *, prefix: str = "",
                     only: Iterable[str] | None = None) -> ImportReport:
    """List the server's tools and create or refresh the tenant's ``mcp`` Tool rows (see the module doc)."""
    acting(actor).require("operate", tenant.pk)
    server = normalize_server(server)
    if prefix and not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", prefix):
        raise McpServerError(f"The prefix {prefix!r} may only use letters, digits, _ and - (at most 32 characters).")
    timeout = float(server.get("timeout", DEFAULT_TIMEOUT))
    # Outside any transaction, holding no database connection, in one of the tenant's few slots: it starts or reaches
    # a server the tenant chose, which may take its time (core/remote_waits.py).
    with remote_wait(tenant.pk, seconds=timeout * 2, what="the import of the MCP server's tools"):
        specs = list_server_tools(server)
    wanted = set(only) if only is not None else None
    identity = server_identity(server)
    report = ImportReport()
    with transaction.atomic():
        existing = {t.name: t for t in Tool.objects.for_tenant(tenant).select_for_update()}
        mine = {t.config.get("tool"): t for t in existing.values()
                if t.kind == ToolKind.MCP and isinstance(t.config.get("server"), dict)
                and server_identity(t.config["server"]) == identity}
        listed = set()
        for spec in specs:
            listed.add(spec.name)
            if wanted is not None and spec.name not in wanted:
                continue
            name = tool_name_for(spec.name, prefix)
            if not _NAME_RE.match(name):
                report.skipped.append((spec.name, f"{name!r} is not a usable tool name"))
                continue
            defaults = _defaults(spec, server)
            current = existing.get(name)
            if current is not None and mine.get(spec.name) is not current:
                report.skipped.append((name, "the tenant already has a different tool with this name; import with a prefix"))
                continue
            if current is None:
                tool = Tool.objects.create(tenant=tenant, name=name, timeout_seconds=float(server.get("timeout", DEFAULT_TIMEOUT)),
                                           **defaults)
                report.created.append(name)
                record_change(tenant=tenant, actor=actor, action="tool.created", target=tool,
                              details={"kind": "mcp", "server": identity, "tool": spec.name})
                continue
            # A refresh keeps the operator's own choices (category, approval, enabled, timeout...).
            changed = [k for k in ("description", "parameters", "output_schema", "config") if getattr(current, k) != defaults[k]]
            for key in changed:
                setattr(current, key, defaults[key])
            if changed:
                current.save(update_fields=[*changed, "updated_at"])
                record_change(tenant=tenant, actor=actor, action="tool.updated", target=current,
                              details={"kind": "mcp", "server": identity, "tool": spec.name, "changed": changed})
            report.updated.append(name)
        report.stale = sorted(t.name for original, t in mine.items() if original not in listed)
    return report
