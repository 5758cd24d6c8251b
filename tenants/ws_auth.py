"""Websocket authentication: an API key in the Authorization header, or the session cookie.

A session (cookie) connection must come from an allowed Origin: a page on another site could
otherwise open a socket with the user's cookie. API-key connections carry no ambient
credentials, so their Origin is not checked.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.conf import settings
from django.http.request import validate_host

from tenants.auth import bearer_token, find_api_key
from tenants.scoping import ANONYMOUS, Actor, actor_for_api_key, actor_for_user


def _header(scope: dict[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value
    return None


def _netloc(scheme: str, host: str) -> str:
    """``host[:port]`` with the scheme's default port made explicit, so ``http://a`` and ``http://a:80`` compare equal."""
    default = "443" if scheme in ("https", "wss") else "80"
    if host.endswith("]") or ":" not in host.rsplit("]", 1)[-1]:
        return f"{host}:{default}".lower()
    return host.lower()


def origin_allowed(origin: bytes | None, host: bytes | None, scheme: str = "ws") -> bool:
    """Like Django's CSRF origin check: the page's origin (scheme, host and port) is this server's, or trusted."""
    if origin is None:
        return True  # not a browser
    raw = origin.decode("latin-1")
    parsed = urlparse(raw)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return False
    if raw.rstrip("/") in {o.rstrip("/") for o in settings.CSRF_TRUSTED_ORIGINS}:
        return True
    if host is None:
        return False
    server = host.decode("latin-1")
    server_scheme = "https" if scheme == "wss" else "http"
    # Same host and port as the socket was opened on (a TLS proxy may make the page https while the socket is ws).
    if _netloc(parsed.scheme, parsed.netloc) not in {_netloc(server_scheme, server), _netloc(parsed.scheme, server)}:
        return False
    hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not hosts:
        hosts = [".localhost", "127.0.0.1", "[::1]"]
    return validate_host(parsed.hostname if ":" not in parsed.hostname else f"[{parsed.hostname}]", hosts)


@database_sync_to_async
def _actor(scope: dict[str, Any]) -> Actor:
    token = bearer_token(_header(scope, b"authorization"))
    if token is not None:
        key = find_api_key(token)
        if key is None:
            return ANONYMOUS
        actor = actor_for_api_key(key)
        return actor if actor.roles else ANONYMOUS  # its owner left the tenant: refused, as over HTTP
    user = scope.get("user")
    same_site = origin_allowed(_header(scope, b"origin"), _header(scope, b"host"), scope.get("scheme", "ws"))
    if user is not None and user.is_authenticated and same_site:
        return actor_for_user(user)
    return ANONYMOUS


class _ActorMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        scope = dict(scope)
        scope["actor"] = await _actor(scope)
        return await self.inner(scope, receive, send)


def WebsocketAuthMiddleware(inner: Any) -> Any:
    return AuthMiddlewareStack(_ActorMiddleware(inner))
