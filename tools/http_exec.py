"""Execute HTTP tools through the egress guard.

An :class:`HttpToolSpec` describes the endpoint: a URL template whose ``{param}`` placeholders
are filled with URL-encoded argument values (``quote(safe='')``: ``"../admin"`` or ``"a/b?x"``
stay inside one path segment), the arguments that go into the query string, whether the rest is
sent as a JSON body, and headers whose values may reference secrets (``"secret:NAME"`` or
``"Bearer {secret:NAME}"``), resolved through a callback at execution time only.

``request_preview`` (for approval pages and audit rows) shows the method, URL and headers with
secret values masked; secrets never appear in previews, exceptions or log records.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, urlencode, urlsplit

import httpx

from audit.masking import MASK, is_sensitive_key, mask_text, mask_value
from egress.guard import EgressDenied, EgressPolicy, Resolver, guarded_client

__all__ = [
    "EgressDenied",
    "HttpResult",
    "HttpToolError",
    "HttpToolSpec",
    "RenderedRequest",
    "SecretUnavailable",
    "ToolTimeout",
    "execute_http_tool",
    "render_request",
]

logger = logging.getLogger(__name__)

SecretResolver = Callable[[str], "str | None"]

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SECRET_WHOLE = re.compile(r"^\s*secret:([A-Za-z0-9_.\-/]+)\s*$")
_SECRET_INLINE = re.compile(r"\{secret:([A-Za-z0-9_.\-/]+)\}")
#: Header names whose values are always masked in previews.
_ALWAYS_MASKED_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_RESPONSE_BYTES = 2 * 1024 * 1024
EXCERPT_CHARS = 300


class HttpToolError(Exception):
    """The HTTP tool could not be executed (bad spec, missing parameter, connection failure)."""


class SecretUnavailable(HttpToolError):
    """A header references a secret the resolver does not have (the name is safe to show)."""


class ToolTimeout(HttpToolError):
    """No result was obtained in time. The call may or may not have taken effect."""


@dataclass(frozen=True)
class HttpToolSpec:
    method: str
    url_template: str
    query_params: tuple[str, ...] | list[str] = ()
    body: Literal["json", "none"] = "json"
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 10.0
    max_redirects: int = 3
    max_response_bytes: int = MAX_RESPONSE_BYTES

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", self.method.upper())
        if self.body not in ("json", "none"):
            raise ValueError(f"body must be 'json' or 'none', not {self.body!r}")
        parts = urlsplit(self.url_template)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url_template must be an absolute http(s) URL, got {self.url_template!r}")
        if "{" in parts.scheme + parts.netloc:
            raise ValueError("url_template placeholders are only allowed in the path and query, not in the host")
        if "{" in parts.fragment:
            raise ValueError("url_template placeholders are not allowed in the fragment")

    @property
    def path_params(self) -> list[str]:
        return _PLACEHOLDER.findall(self.url_template)


@dataclass
class RenderedRequest:
    method: str
    url: str
    headers: dict[str, str]
    json_body: Any
    preview: dict[str, Any]
    #: Header names whose values came from secrets (dropped on cross-origin redirects).
    secret_headers: set[str] = field(default_factory=set)

    def __repr__(self) -> str:  # never show header values
        return f"RenderedRequest({self.method} {self.preview['url']})"


@dataclass
class HttpResult:
    status_code: int
    body: Any
    latency_ms: int
    request_preview: dict[str, Any]
    ok: bool = True
    error: str | None = None
    truncated: bool = False
    headers: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- rendering


def _text_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


def _segment(value: Any) -> str:
    encoded = quote(_text_value(value), safe="")
    if encoded and set(encoded) == {"."}:  # "." / ".." would be removed as dot-segments
        encoded = encoded.replace(".", "%2E")
    return encoded


def _query_pairs(names: Iterable[str], arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for name in names:
        if name not in arguments or arguments[name] is None:
            continue
        value = arguments[name]
        if isinstance(value, list | tuple):
            pairs.extend((name, _text_value(v)) for v in value)
        else:
            pairs.append((name, _text_value(value)))
    return pairs


def _masked_url(url: str) -> str:
    """The URL with sensitive-looking query values masked (and free-text patterns masked)."""
    return mask_text(url)


def render_request(
    spec: HttpToolSpec,
    arguments: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    resolve_secret: SecretResolver | None = None,
    sensitive_fields: Iterable[str] = (),
) -> RenderedRequest:
    """Build the request without sending it. Without ``resolve_secret`` secret headers are left
    unresolved (preview only)."""
    arguments = dict(arguments)
    used: set[str] = set()

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in arguments or arguments[name] is None:
            raise HttpToolError(f"missing value for URL parameter {name!r}")
        used.add(name)
        return _segment(arguments[name])

    sensitive_fields = tuple(sensitive_fields)

    def fill_preview(match: re.Match[str]) -> str:
        # A sensitive field in the URL's path or query template is masked in the preview, as in a body.
        return MASK if is_sensitive_key(match.group(1), sensitive_fields) else fill(match)

    base, sep, template_query = spec.url_template.partition("?")
    url = _PLACEHOLDER.sub(fill, base)
    preview_url = _PLACEHOLDER.sub(fill_preview, base)
    if sep:
        url += "?" + _PLACEHOLDER.sub(fill, template_query)
        preview_url += "?" + _PLACEHOLDER.sub(fill_preview, template_query)
    query = _query_pairs(spec.query_params, arguments)
    used.update(spec.query_params)
    if query:
        url += ("&" if "?" in url else "?") + urlencode(query, doseq=False)
        shown = [(k, MASK if is_sensitive_key(k, sensitive_fields) else v) for k, v in query]
        preview_url += ("&" if "?" in preview_url else "?") + urlencode(shown, doseq=False)

    remaining = {k: v for k, v in arguments.items() if k not in used}
    json_body: Any = None
    if spec.body == "json" and (remaining or spec.method in BODY_METHODS):
        json_body = remaining

    headers: dict[str, str] = {}
    preview_headers: dict[str, str] = {}
    secret_headers: set[str] = set()
    for name, raw_value in spec.headers.items():
        value = str(raw_value)
        secret_names = [m.group(1) for m in _SECRET_INLINE.finditer(value)]
        whole = _SECRET_WHOLE.match(value)
        if whole:
            secret_names = [whole.group(1)]
        if secret_names:
            secret_headers.add(name.lower())
            preview_headers[name] = MASK if whole else _SECRET_INLINE.sub(MASK, value)
            if resolve_secret is not None:
                resolved: dict[str, str] = {}
                for secret_name in secret_names:
                    secret = resolve_secret(secret_name)
                    if secret is None or secret == "":
                        raise SecretUnavailable(f"secret {secret_name!r} for header {name!r} is not available")
                    resolved[secret_name] = str(secret)
                if whole:
                    headers[name] = resolved[secret_names[0]]
                else:
                    headers[name] = _SECRET_INLINE.sub(lambda m, r=resolved: r[m.group(1)], value)
        else:
            headers[name] = value
            masked = name.lower() in _ALWAYS_MASKED_HEADERS or is_sensitive_key(name)
            preview_headers[name] = MASK if masked else value
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
        preview_headers["Idempotency-Key"] = idempotency_key

    preview: dict[str, Any] = {"method": spec.method, "url": _masked_url(preview_url), "headers": preview_headers}
    if json_body is not None:
        preview["body"] = mask_value(json_body, sensitive_fields)
    return RenderedRequest(
        method=spec.method,
        url=url,
        headers=headers,
        json_body=json_body,
        preview=preview,
        secret_headers=secret_headers,
    )


# --------------------------------------------------------------------------- execution


def _excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    text = " ".join(text.split())
    return mask_text(text[:limit] + ("…" if len(text) > limit else ""))


def _parse_body(content: bytes, content_type: str, encoding: str | None) -> Any:
    text = content.decode(encoding or "utf-8", errors="replace")
    if "json" in content_type.lower() or text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def execute_http_tool(
    spec: HttpToolSpec,
    arguments: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    resolve_secret: SecretResolver | None = None,
    allow: EgressPolicy | Iterable[str] | None = None,
    resolver: Resolver | None = None,
    sensitive_fields: Iterable[str] = (),
    transport_kwargs: dict[str, Any] | None = None,
    deadline: float | None = None,
) -> HttpResult:
    """Send the request described by ``spec`` with ``arguments`` through the egress guard.

    The whole exchange (connecting, every redirect, sending, the headers and the body) ends by
    ``spec.timeout`` seconds from now, or by ``deadline`` (``time.monotonic()``) if that is
    sooner: every socket operation waits at most the time left, and the connection is closed
    when it runs out. (Only the DNS lookup is not bounded: ``getaddrinfo`` cannot be interrupted.)

    Raises :class:`EgressDenied` (policy), :class:`ToolTimeout` (no result in time),
    :class:`SecretUnavailable` / :class:`HttpToolError` (could not execute). A non-2xx reply is
    not raised: it comes back with ``ok=False`` and ``error`` holding the status and a short,
    masked body excerpt.
    """
    request = render_request(
        spec,
        arguments,
        idempotency_key=idempotency_key,
        resolve_secret=resolve_secret or _no_secrets,
        sensitive_fields=sensitive_fields,
    )
    safe_target = f"{spec.method} {request.preview['url']}"
    started = time.monotonic()
    ends = started + float(spec.timeout) if deadline is None else min(started + float(spec.timeout), deadline)
    deadline_s = max(0.0, ends - started)
    try:
        with guarded_client(
            allow=allow,
            timeout=max(deadline_s, 0.001),
            deadline=ends,
            resolver=resolver,
            max_redirects=spec.max_redirects,
            sensitive_headers=request.secret_headers,
            transport_kwargs=transport_kwargs,
            headers={"User-Agent": "agentops-tool-gateway/1"},
        ) as client:
            http_request = client.build_request(
                request.method,
                request.url,
                headers=request.headers,
                json=request.json_body if request.json_body is not None else None,
            )
            response = client.send(http_request, stream=True)
            try:
                chunks: list[bytes] = []
                size = 0
                truncated = False
                for chunk in response.iter_bytes():
                    if time.monotonic() > ends:
                        raise httpx.ReadTimeout("overall deadline exceeded", request=http_request)
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > spec.max_response_bytes:
                        truncated = True
                        break
                content = b"".join(chunks)[: spec.max_response_bytes]
            finally:
                response.close()
    except EgressDenied:
        raise
    except httpx.TimeoutException:
        raise ToolTimeout(
            f"{safe_target} timed out after {round(deadline_s, 2):g}s; no result was obtained. Do not tell the user it succeeded."
        ) from None
    except httpx.TooManyRedirects:
        raise HttpToolError(f"{safe_target}: too many redirects (more than {spec.max_redirects})") from None
    except httpx.HTTPError as exc:
        raise HttpToolError(f"{safe_target} failed: {type(exc).__name__}: {mask_text(str(exc))}") from None
    latency_ms = int((time.monotonic() - started) * 1000)

    body = _parse_body(content, response.headers.get("content-type", ""), response.encoding)
    result = HttpResult(
        status_code=response.status_code,
        body=body,
        latency_ms=latency_ms,
        request_preview=request.preview,
        truncated=truncated,
        headers={k: v for k, v in response.headers.items() if k.lower() in ("content-type", "location", "retry-after")},
    )
    if not 200 <= response.status_code < 300:
        text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
        reason = response.reason_phrase or ""
        result.ok = False
        result.error = f"HTTP {response.status_code} {reason}".rstrip() + (f": {_excerpt(text)}" if text else "")
    logger.info(
        "http tool %s -> %s in %sms", safe_target, response.status_code, latency_ms
    )  # no headers, no body: they may hold secrets or personal data
    return result


def _no_secrets(name: str) -> str | None:
    return None
