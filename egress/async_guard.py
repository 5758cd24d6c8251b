"""The egress guard for ``httpx2`` async clients (the MCP SDK's HTTP transports).

Same rule as :class:`egress.guard.GuardedTransport`: every request's host is resolved once, every
address is checked against the policy, and the connection goes to the *validated IP* (``Host``
and TLS SNI keep the name). A check made earlier (before secrets are resolved) is a fast refusal
only; this one, made for the very connection, is what closes the DNS-rebinding window. Given a
``max_response_bytes``, a response body past it (decompressed: identity is asked, gzip/deflate decoded here a chunk
at a time) ends in :class:`AsyncResponseTooLarge` while it is read; an MCP session is one tool call, so the bound is
what one call may receive.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import anyio.to_thread
import httpx2

from egress.guard import BodyBound, EgressPolicy, Resolver

__all__ = ["AsyncGuardedTransport", "AsyncResponseTooLarge", "guarded_async_client"]


class AsyncResponseTooLarge(httpx2.ReadError):
    """A response body past the client's ``max_response_bytes`` (decompressed), or one it cannot bound."""


class _CappedAsyncStream(httpx2.AsyncByteStream):
    """A response body that stops at its ``BodyBound``."""

    def __init__(self, inner: httpx2.AsyncByteStream, bound: BodyBound) -> None:
        self._inner, self._bound = inner, bound

    async def __aiter__(self) -> Any:
        async for chunk in self._inner:
            if out := self._bound.feed(chunk):
                yield out
        if tail := self._bound.finish():
            yield tail

    async def aclose(self) -> None:
        await self._inner.aclose()


class AsyncGuardedTransport(httpx2.AsyncBaseTransport):
    """An async transport that resolves, validates and connects to the validated IP.

    Connections are pooled per (scheme, host name, port), so a TLS connection verified for one
    name is never reused for another name sharing its IP. Raises :class:`egress.guard.EgressDenied`.
    """

    def __init__(self, *, allow: EgressPolicy | Iterable[str] | None = None, resolver: Resolver | None = None,
                 max_response_bytes: int | None = None, **transport_kwargs: Any) -> None:
        for forbidden in ("proxy", "uds"):  # a proxy or a socket would make the pinned IP meaningless
            transport_kwargs.pop(forbidden, None)
        transport_kwargs["trust_env"] = False
        self.policy = EgressPolicy.coerce(allow, resolver)
        #: The largest response body this transport hands on, decompressed (None: no bound).
        self.max_response_bytes = max_response_bytes
        self._transport_kwargs = transport_kwargs
        self._pools: dict[tuple[str, str, int], httpx2.AsyncHTTPTransport] = {}
        #: Every (host, ip, port) this transport connected to, in order (for tests and audit).
        self.connections: list[tuple[str, str, int]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        target = await anyio.to_thread.run_sync(self.policy.check, str(request.url))  # DNS blocks: off the loop
        extensions = dict(request.extensions)
        if target.scheme == "https":
            extensions.setdefault("sni_hostname", target.host)
        headers = httpx2.Headers(request.headers)
        if "host" not in headers:
            headers["Host"] = request.url.netloc.decode("ascii")
        if self.max_response_bytes is not None:
            headers["Accept-Encoding"] = "identity"
        pinned = httpx2.Request(
            request.method, request.url.copy_with(host=target.ip), headers=headers, stream=request.stream, extensions=extensions
        )
        self.connections.append((target.host, target.ip, target.port))
        key = (target.scheme, target.host.lower(), target.port)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = httpx2.AsyncHTTPTransport(**self._transport_kwargs)
        response = await pool.handle_async_request(pinned)
        if self.max_response_bytes is None:
            return response
        try:
            bound = BodyBound.for_response(response.headers, self.max_response_bytes,
                                           lambda message: AsyncResponseTooLarge(message, request=request))
        except AsyncResponseTooLarge:
            await response.aclose()
            raise
        response.stream = _CappedAsyncStream(response.stream, bound)  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


def guarded_async_client(*, allow: EgressPolicy | Iterable[str] | None = None, resolver: Resolver | None = None,
                         max_response_bytes: int | None = None, **client_kwargs: Any) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` on :class:`AsyncGuardedTransport` that follows no redirects by itself."""
    for forbidden in ("transport", "mounts", "proxy", "trust_env", "follow_redirects"):
        client_kwargs.pop(forbidden, None)
    transport = AsyncGuardedTransport(allow=allow, resolver=resolver, max_response_bytes=max_response_bytes)
    return httpx2.AsyncClient(transport=transport, trust_env=False, follow_redirects=False, **client_kwargs)
