"""Kind ``http``: an HTTP endpoint (``config = {"method", "url", "query_params", "body", "headers", "allow_hosts"}``).

The URL is a template of the tool's parameters; header values may name secrets (``secret:NAME``).
Every request goes through the egress guard (tools.http_exec).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from django.conf import settings

from egress.guard import EgressDenied, allow_list_problems, check_url
from tools.executors import ExecContext, ToolFailure, resolve_secret
from tools.http_exec import HttpToolError, HttpToolSpec, SecretUnavailable, ToolTimeout, execute_http_tool, render_request
from tools.kinds.base import AddProblem, Kind, secret_problems, string_list
from tools.models import Tool

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def spec(tool: Tool) -> HttpToolSpec:
    config = tool.config or {}
    return HttpToolSpec(
        method=str(config.get("method", "GET")),
        url_template=str(config.get("url", "")),
        query_params=list(config.get("query_params", [])),
        body=config.get("body", "json"),
        headers=dict(config.get("headers", {})),
        timeout=float(config.get("timeout", tool.timeout_seconds)),
    )


def egress_allow_list(tool: Tool, ctx: ExecContext) -> list[str]:
    """The operator allow-list (settings) plus the tool's own declared hosts."""
    allowed: Iterable[str] = (*settings.TOOL_EGRESS_ALLOW, *ctx.egress_allow, *(tool.config or {}).get("allow_hosts", []))
    return [a for a in allowed if a]


def execute(tool: Tool, arguments: dict[str, Any], ctx: ExecContext) -> Any:
    http, allow = spec(tool), egress_allow_list(tool, ctx)
    try:
        # Check the destination before any secret is resolved for it; the transport checks again at connect time.
        check_url(render_request(http, arguments).url, allow=allow)
        result = execute_http_tool(
            http,
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


def request_preview(tool: Tool, arguments: dict[str, Any], sensitive_fields: Sequence[str]) -> Any:
    return render_request(spec(tool), arguments, sensitive_fields=sensitive_fields).preview


def check(config: dict[str, Any], parameters: dict[str, Any], tenant: Any, add: AddProblem) -> None:
    properties = set((parameters or {}).get("properties") or {})
    method = str(config.get("method", "GET")).upper()
    if method not in METHODS:
        add("method", f"must be one of {', '.join(METHODS)}; got {config.get('method')!r}")
    url = config.get("url")
    if not isinstance(url, str) or not url:
        add("url", "is required: the endpoint, e.g. https://api.example.com/orders/{order_id}")
    else:
        try:
            HttpToolSpec(method=method if method in METHODS else "GET", url_template=url)
        except ValueError as exc:
            add("url", str(exc))
        for name in _PLACEHOLDER.findall(url):
            if name not in properties:
                add("url", f"the placeholder {{{name}}} is not a parameter of the tool; add it to parameters.properties")
    query = config.get("query_params", [])
    if not string_list(query):
        add("query_params", "must be a list of parameter names")
    else:
        for name in query:
            if name not in properties:
                add("query_params", f"{name!r} is not a parameter of the tool")
    if config.get("body", "json") not in ("json", "none"):
        add("body", 'must be "json" or "none"')
    headers = config.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        add("headers", 'must be an object of strings; a secret is written "secret:NAME" or "Bearer {secret:NAME}"')
    for message in secret_problems(headers, tenant):
        add("headers", message)
    for message in allow_list_problems(config.get("allow_hosts", [])):
        add("allow_hosts", message)


KIND = Kind(name="http", execute=execute, check=check, request_preview=request_preview)
