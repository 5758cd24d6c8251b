"""Kind ``http``: an HTTP endpoint (``config = {"method", "url", "query_params", "body", "headers", "allow_hosts"}``).

The URL is a template of the tool's parameters; header values may name secrets (``secret:NAME``).
Every request goes through the egress guard (tools.http_exec).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

from django.conf import settings
from pydantic import Field, ValidationInfo, field_validator

from egress.guard import EgressDenied, allow_list_problems, check_url
from runtime.documents import Leaf, choice, json_list, number, problem, problems_of
from tools.executors import ExecContext, ToolFailure, resolve_secret
from tools.http_exec import HttpToolError, HttpToolSpec, SecretUnavailable, ToolTimeout, execute_http_tool, render_request
from tools.kinds.base import Kind, ToolConfig, read_config, saving, secret_problems, string_list
from tools.models import Tool

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
URL_EXAMPLE = "https://api.example.com/orders/{order_id}"


def _method(value: Any) -> str:
    if not isinstance(value, str) or value.upper() not in METHODS:
        raise problem(f"must be one of {', '.join(METHODS)}", value)
    return value.upper()


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise problem(f"must be the endpoint, e.g. {URL_EXAMPLE}", value)
    try:
        HttpToolSpec(method="GET", url_template=value)
    except ValueError as exc:
        raise problem(str(exc)) from None
    return value


def _headers(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise problem('must be an object of strings; a secret is written "secret:NAME" or "Bearer {secret:NAME}"', value)
    return value


class HttpConfig(ToolConfig):
    """An HTTP endpoint; the URL is a template of the tool's parameters, header values may name secrets."""

    method: Annotated[str, Leaf(_method, {"type": "string", "enum": list(METHODS)})] = "GET"
    url: Annotated[str, Leaf(_url, {"type": "string", "minLength": 1}), Field(description=f"the endpoint, e.g. {URL_EXAMPLE}")]
    query_params: Annotated[list[str], json_list("must be a list of parameter names", {"type": "array", "items": {"type": "string"}})] = []
    body: Annotated[Literal["json", "none"], choice("json", "none")] = "json"
    headers: Annotated[dict[str, str], Leaf(_headers, {"type": "object", "additionalProperties": {"type": "string"}})] = {}
    allow_hosts: Annotated[list[str], Field(description="private hosts/CIDRs (optionally :port) the tool may reach; "
                                                        "set by a platform administrator")] = []
    timeout: Annotated[float | None, number(), Field(description="seconds (default: the tool's timeout)")] = None

    @field_validator("url")
    @classmethod
    def _placeholders_are_parameters(cls, url: str, info: ValidationInfo) -> str:
        context = saving(info)
        if context is not None:
            properties = set(context["parameters"].get("properties") or {})
            missing = [n for n in _PLACEHOLDER.findall(url) if n not in properties]
            if missing:
                raise problems_of(f"$: the placeholder {{{n}}} is not a parameter of the tool; add it to parameters.properties"
                                  for n in missing)
        return url

    @field_validator("query_params")
    @classmethod
    def _query_params_are_parameters(cls, names: list[str], info: ValidationInfo) -> list[str]:
        if not string_list(names):
            raise problem("must be a list of parameter names")
        context = saving(info)
        if context is not None:
            properties = set(context["parameters"].get("properties") or {})
            if any(n not in properties for n in names):
                raise problems_of(f"$: {n!r} is not a parameter of the tool" for n in names if n not in properties)
        return names

    @field_validator("headers")
    @classmethod
    def _secrets_granted(cls, headers: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        context = saving(info)
        found = secret_problems(headers, context["tenant"]) if context is not None else []
        if found:
            raise problems_of(f"$: {message}" for message in found)
        return headers

    @field_validator("allow_hosts", mode="before")
    @classmethod
    def _allow_list(cls, value: Any) -> Any:
        found = allow_list_problems(value)
        if found:
            raise problems_of(f"$: {message}" for message in found)
        return value


def spec(tool: Tool) -> HttpToolSpec:
    config = read_config(HttpConfig, tool)
    return HttpToolSpec(
        method=config.method,
        url_template=config.url,
        query_params=list(config.query_params),
        body=config.body,
        headers=dict(config.headers),
        timeout=float(config.timeout if config.timeout is not None else tool.timeout_seconds),
    )


def egress_allow_list(tool: Tool, ctx: ExecContext) -> list[str]:
    """The operator allow-list (settings) plus the tool's own declared hosts."""
    allowed: Iterable[str] = (*settings.TOOL_EGRESS_ALLOW, *ctx.egress_allow, *read_config(HttpConfig, tool).allow_hosts)
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


KIND = Kind(name="http", execute=execute, config_model=HttpConfig, request_preview=request_preview)
