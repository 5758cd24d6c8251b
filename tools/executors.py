"""How each kind of tool is executed: an explicit table, frozen in use.

An executor gets the Tool row, the validated arguments and an ExecContext, and returns the raw
result (any JSON-able value) or raises. The gateway around it owns timeouts, bulkheads, shaping
and audit; executors only do the call, and end it by ``ctx.deadline`` where they can (an HTTP
request is bounded by it, a process-isolated Python tool is killed at it, a cooperative one sees
``ctx.cancel``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from tools.models import Tool


@dataclass(frozen=True)
class ExecContext:
    tenant_id: int
    run: Any
    step: int
    call_id: str
    span_id: str
    idempotency_key: str | None = None
    #: Outbound hosts/CIDRs this call may reach besides the public internet (operator allow-list).
    egress_allow: tuple[str, ...] = field(default_factory=tuple)
    #: Set by the gateway when the call's time is up; a long-running executor stops when it sees it (``tools.cancel``).
    cancel: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    #: ``time.monotonic()`` at which the gateway stops waiting for the call (None: no deadline).
    deadline: float | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()


class ToolFailure(Exception):
    """A failure the model should read, with the audit status to record (e.g. ``egress_denied``)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


Executor = Callable[[Tool, dict[str, Any], ExecContext], Any]


def run_python(tool: Tool, arguments: dict[str, Any], ctx: ExecContext) -> Any:
    from tools.pyfunc import registry

    key = str(tool.config.get("function", ""))
    if tool.config.get("isolation") == "process":  # in a child process, killed at the deadline (tools.isolation)
        from tools.isolation import run_in_process

        deadline = ctx.deadline if ctx.deadline is not None else time.monotonic() + float(tool.timeout_seconds)
        return run_in_process(key, arguments, deadline=deadline, label=tool.name)
    return registry.call(key, arguments)


def resolve_secret(name: str) -> str:
    """``secret:NAME`` header values come from the environment variable ``TOOL_SECRET_<NAME>``."""
    value = os.environ.get(f"TOOL_SECRET_{name}")
    if value is None:
        from tools.http_exec import SecretUnavailable

        raise SecretUnavailable(f"the secret {name} is not configured (set TOOL_SECRET_{name})")
    return value


def http_spec(tool: Tool) -> Any:
    from tools.http_exec import HttpToolSpec

    config = tool.config or {}
    return HttpToolSpec(
        method=str(config.get("method", "GET")),
        url_template=str(config.get("url", "")),
        query_params=list(config.get("query_params", [])),
        body=config.get("body", "json"),
        headers=dict(config.get("headers", {})),
        timeout=float(config.get("timeout", tool.timeout_seconds)),
    )


def run_http(tool: Tool, arguments: dict[str, Any], ctx: ExecContext) -> Any:
    from egress.guard import EgressDenied, check_url
    from tools.http_exec import HttpToolError, SecretUnavailable, ToolTimeout, execute_http_tool, render_request

    spec, allow = http_spec(tool), egress_allow_list(tool, ctx)
    try:
        # Check the destination before any secret is resolved for it; the transport checks again at connect time.
        check_url(render_request(spec, arguments).url, allow=allow)
        result = execute_http_tool(
            spec,
            arguments,
            idempotency_key=ctx.idempotency_key,
            resolve_secret=resolve_secret,
            allow=allow,
            sensitive_fields=tool.sensitive_fields or (),
            deadline=ctx.deadline,
        )
    except EgressDenied as exc:
        raise ToolFailure("egress_denied", f"The call was blocked before it left: {exc.reason}") from None
    except ToolTimeout as exc:
        raise ToolFailure("timeout", f"No result was obtained ({exc}). Do not tell the user it succeeded.") from None
    except (SecretUnavailable, HttpToolError) as exc:
        raise ToolFailure("error", f"The tool {tool.name} could not be called: {exc}") from None
    if not result.ok:
        raise ToolFailure("error", f"The service answered with an error: {result.error}")
    return result.body


def egress_allow_list(tool: Tool, ctx: ExecContext) -> list[str]:
    """The operator allow-list (settings) plus the tool's own declared hosts."""
    allowed: Iterable[str] = (*settings.TOOL_EGRESS_ALLOW, *ctx.egress_allow, *(tool.config or {}).get("allow_hosts", []))
    return [a for a in allowed if a]


EXECUTORS: dict[str, Executor] = {
    "python": run_python,
    "http": run_http,
    "mcp": lambda tool, arguments, ctx: __import__("tools.mcp_import", fromlist=["run_mcp"]).run_mcp(tool, arguments, ctx),
    "agent": lambda tool, arguments, ctx: __import__("tools.agent_exec", fromlist=["run_agent"]).run_agent(tool, arguments, ctx),
}


def executor_for(kind: str) -> Executor:
    try:
        return EXECUTORS[kind]
    except KeyError:
        raise ToolFailure("error", f"Tools of kind {kind!r} cannot be executed here.") from None
