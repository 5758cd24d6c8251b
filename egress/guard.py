"""SSRF guard for outbound HTTP made by tools.

Policy: only ``http``/``https``; the host is resolved once and the call is refused if ANY
resolved address is loopback, link-local (incl. cloud metadata), private, CGNAT, unspecified,
multicast, reserved or otherwise not globally routable -- including IPv6 forms that embed such
an IPv4 address (IPv4-mapped/compatible, 6to4, Teredo, NAT64). Numeric host spellings that
``getaddrinfo``/``inet_aton`` accept (``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``)
are normalised first. An operator allow-list of host names and CIDRs overrides the block; an
entry may name a port (``api.internal:8443``, ``[fd00::1]:443``, ``10.0.4.0/24:8443``), and then
the exception holds for that port only (:func:`parse_allow_entry`, :func:`allow_list_problems`).

Enforcement happens at connect time: :class:`GuardedTransport` resolves, validates, and then
connects to the *validated IP* (Host header and TLS SNI keep the original name), so there is no
DNS-rebinding window between the check and the connection. :func:`guarded_client` builds an
``httpx.Client`` on that transport that follows redirects itself, checking every hop. Given a
``deadline``, every connect, TLS handshake, read and write of the client waits at most the time
left until it (:class:`DeadlineBackend`), so a slow or trickling server cannot hold a call past it. Given a
``max_response_bytes``, a response body past it (counted after decompression: the client asks for ``identity``
and decodes gzip/deflate itself, a chunk at a time) ends in :class:`ResponseTooLarge`, so a hostile server cannot
fill the process's memory with one answer or a small compressed bomb.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import ssl
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx

__all__ = [
    "ALLOW_ENTRY_FORMS",
    "TENANT_ANSWER_BYTES",
    "AllowEntry",
    "BodyBound",
    "DeadlineBackend",
    "EgressDenied",
    "EgressPolicy",
    "GuardedClient",
    "GuardedTransport",
    "ResolvedTarget",
    "Resolver",
    "ResponseTooLarge",
    "allow_list_problems",
    "check_url",
    "classify_ip",
    "guarded_client",
    "normalize_numeric_host",
    "parse_allow_entry",
    "system_resolver",
]

#: ``resolver(host, port) -> list of IP address strings``.
Resolver = Callable[[str, int], list[str]]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOWED_SCHEMES = ("http", "https")
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
DEFAULT_MAX_REDIRECTS = 5
#: Headers dropped when a redirect changes origin (scheme, host or port).
CROSS_ORIGIN_STRIP = frozenset({"authorization", "proxy-authorization", "cookie"})

_ADVICE = "outbound calls from tools may not reach it. Ask an operator to allow-list it if this is intended."

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_METADATA = {
    ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack...
    ipaddress.ip_address("169.254.170.2"),  # AWS ECS task metadata
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
    ipaddress.ip_address("fd00:ec2::254"),  # AWS IPv6 metadata
}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


class EgressDenied(Exception):
    """An outbound call was refused by the egress policy. ``reason`` is readable by model and operator."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"egress denied for {url}: {reason}")
        self.url = url
        self.reason = reason


class ResolutionError(httpx.ConnectError):
    """The host name could not be resolved (a network error, not a policy decision)."""


# --------------------------------------------------------------------------- classification


def normalize_numeric_host(host: str) -> IPAddress | None:
    """Return the IP a numeric host spelling denotes, or None for a real name.

    Handles dotted/undotted decimal, octal (leading 0) and hex (0x) parts the way ``inet_aton``
    does (``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``, ``0x7f.1``) and IPv6
    literals (with or without brackets / zone id).
    """
    h = host.strip().rstrip(".")
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if ":" in h:
        try:
            return ipaddress.IPv6Address(h.split("%", 1)[0])
        except ValueError:
            return None
    parts = h.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        if not part:
            return None
        try:
            if re.fullmatch(r"0[xX][0-9a-fA-F]*", part):
                values.append(int(part[2:] or "0", 16))
            elif re.fullmatch(r"0[0-7]+", part):
                values.append(int(part, 8))
            elif re.fullmatch(r"[0-9]+", part):
                if len(part) > 1 and part.startswith("0"):
                    return None  # e.g. "09": invalid octal, inet_aton refuses it too
                values.append(int(part, 10))
            else:
                return None
        except ValueError:
            return None
    # inet_aton: a.b.c.d / a.b.c(16 bit) / a.b(24 bit) / a(32 bit)
    *head, last = values
    if any(v > 255 for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = 0
    for v in head:
        number = (number << 8) | v
    number = (number << (8 * (4 - len(head)))) | last
    return ipaddress.IPv4Address(number)


def _a(phrase: str) -> str:
    return "an" if phrase[:1].lower() in "aeiou" or phrase.startswith("IPv4") else "a"


def _classify_v4(ip: ipaddress.IPv4Address) -> str | None:
    if ip in _METADATA:
        return "link-local address (cloud metadata)" if ip.is_link_local else "cloud metadata address"
    if ip.is_unspecified or ip in ipaddress.ip_network("0.0.0.0/8"):
        return "unspecified address"
    if ip.is_loopback:
        return "loopback address (this machine)"
    if ip.is_link_local:
        return "link-local address"
    if ip in _CGNAT:
        return "carrier-grade NAT (shared, 100.64.0.0/10) address"
    if ip.is_multicast:
        return "multicast address"
    if ip == ipaddress.IPv4Address("255.255.255.255"):
        return "broadcast address"
    if ip.is_reserved:
        return "reserved address"
    if ip.is_private:
        return "private address"
    if not ip.is_global:
        return "non-public (special-purpose) address"
    return None


def classify_ip(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be reached (e.g. ``"private address"``), or None if it is public."""
    if isinstance(ip, ipaddress.IPv4Address):
        return _classify_v4(ip)
    if ip.scope_id:
        ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
    embedded: list[tuple[str, ipaddress.IPv4Address]] = []
    if ip.ipv4_mapped is not None:
        embedded.append(("IPv4-mapped", ip.ipv4_mapped))
    packed = int(ip)
    if packed >> 32 == 0 and packed > 1:  # deprecated IPv4-compatible ::a.b.c.d
        embedded.append(("IPv4-compatible", ipaddress.IPv4Address(packed & 0xFFFFFFFF)))
    if ip.sixtofour is not None:
        embedded.append(("6to4", ip.sixtofour))
    if ip.teredo is not None:
        server, client = ip.teredo
        embedded.extend([("Teredo", server), ("Teredo", client)])
    if ip in _NAT64 or ip in _NAT64_LOCAL:
        embedded.append(("NAT64", ipaddress.IPv4Address(packed & 0xFFFFFFFF)))
    for label, v4 in embedded:
        why = _classify_v4(v4)
        if why:
            return f"{label} form of {v4}, {_a(why)} {why}"
    if embedded:
        return None  # an IPv6 spelling of public IPv4 addresses
    if ip in _METADATA:
        return "cloud metadata address"
    if ip.is_unspecified:
        return "unspecified address"
    if ip.is_loopback:
        return "loopback address (this machine)"
    if ip.is_link_local:
        return "link-local address"
    if ip.is_site_local:
        return "site-local address"
    if ip.is_multicast:
        return "multicast address"
    if ip in ipaddress.ip_network("fc00::/7"):
        return "private (unique local) address"
    if ip.is_reserved:
        return "reserved address"
    if ip.is_private:
        return "private address"
    if not ip.is_global:
        return "non-public (special-purpose) address"
    return None


# --------------------------------------------------------------------------- policy


def system_resolver(host: str, port: int) -> list[str]:
    """Resolve with ``getaddrinfo``; returns the distinct addresses in resolver order."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ResolutionError(f"could not resolve host {host!r}: {exc}") from None
    seen: list[str] = []
    for info in infos:
        address = str(info[4][0]).split("%", 1)[0]
        if address not in seen:
            seen.append(address)
    return seen


@dataclass(frozen=True)
class ResolvedTarget:
    """A validated destination: connect to ``ip``; ``host`` is what goes in Host/SNI."""

    scheme: str
    host: str
    port: int
    ip: str
    addresses: tuple[str, ...]


ALLOW_ENTRY_FORMS = (
    "a host name (api.internal), *.suffix (*.corp.example), an IP or CIDR (10.0.4.0/24, fd00::/8), "
    "each optionally with :port (api.internal:8443, [fd00::1]:443, 10.0.4.0/24:8443)"
)
_HOST_NAME = re.compile(r"^(\*\.)?[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_]([a-z0-9_-]{0,62}))*\.?$")


@dataclass(frozen=True)
class AllowEntry:
    """One allow-list exception: a host name, a ``*.`` suffix or a network; ``port`` None means any port."""

    host: str = ""
    suffix: str = ""
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    port: int | None = None

    def allows_host(self, host: str, port: int | None) -> bool:
        name = host.lower().rstrip(".")
        matched = bool(self.host and name == self.host) or bool(self.suffix and name.endswith(self.suffix))
        return matched and self.port in (None, port)

    def allows_ip(self, ip: IPAddress, port: int | None) -> bool:
        net = self.network
        return net is not None and ip.version == net.version and ip in net and self.port in (None, port)


def _port(text: str, entry: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or not 1 <= int(text) <= 65535:
        raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535, got {text!r}")
    return int(text)


def _network(text: str, entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(f"{entry!r}: {text!r} is not a valid IP address or CIDR range; expected {ALLOW_ENTRY_FORMS}") from None


def parse_allow_entry(entry: str) -> AllowEntry:
    """``"10.0.4.0/24:8443"`` -> network and port. Raises ``ValueError`` saying what is wrong and what is expected."""
    if not isinstance(entry, str) or not entry.strip():
        raise ValueError(f"an empty entry; expected {ALLOW_ENTRY_FORMS}")
    text = entry.strip().lower()
    if "://" in text or "@" in text or "?" in text:
        raise ValueError(f"{entry!r}: give a host, not a URL; expected {ALLOW_ENTRY_FORMS}")
    if text.startswith("["):  # [v6], [v6]:port, [v6/len]:port, [v6]/len, [v6]/len:port
        inside, bracket, rest = text[1:].partition("]")
        if not bracket:
            raise ValueError(f"{entry!r}: a '[' without its ']'; expected {ALLOW_ENTRY_FORMS}")
        if rest.startswith("/"):
            length, _, port_text = rest[1:].partition(":")
            inside, rest = f"{inside}/{length}", (f":{port_text}" if port_text or rest.endswith(":") else "")
        if rest and not rest.startswith(":"):
            raise ValueError(f"{entry!r}: only :port may follow ']'; expected {ALLOW_ENTRY_FORMS}")
        network = _network(inside, entry)
        if network.version != 6:
            raise ValueError(f"{entry!r}: brackets are for IPv6 addresses; write {inside}{rest} instead")
        return AllowEntry(network=network, port=_port(rest[1:], entry) if rest else None)
    if text.count(":") > 1:  # a bare IPv6 address or range: no port (write [v6]:port for one)
        return AllowEntry(network=_network(text, entry))
    where, colon, port_text = text.partition(":")
    port = _port(port_text, entry) if colon else None
    if "/" in where or re.fullmatch(r"[0-9.]+", where):
        return AllowEntry(network=_network(where, entry), port=port)
    if not _HOST_NAME.match(where) or len(where) > 253:
        raise ValueError(f"{entry!r}: {where!r} is not a valid host name; expected {ALLOW_ENTRY_FORMS}")
    if where.startswith("*."):
        return AllowEntry(suffix=where[1:].rstrip("."), port=port)
    return AllowEntry(host=where.rstrip("."), port=port)


def allow_list_problems(entries: Any) -> list[str]:
    """What is wrong with an allow-list (a list of strings), one message per bad entry."""
    if not isinstance(entries, list | tuple) or not all(isinstance(e, str) for e in entries):
        return [f"must be a list of strings: {ALLOW_ENTRY_FORMS}"]
    problems: list[str] = []
    for entry in entries:
        try:
            parse_allow_entry(entry)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


@dataclass
class EgressPolicy:
    """Allow-list + resolver. ``allow`` holds host names (``api.internal``, ``*.corp.example``)
    and IPs/CIDRs (``127.0.0.1/32``, ``10.20.0.0/16``) that override the block, each optionally
    limited to one port (``api.internal:8443``, ``[fd00::1]:443``, ``10.0.4.0/24:8443``).

    An entry that does not parse allows nothing (allow-lists are validated where they are
    configured: settings at start-up, tool configs when saved)."""

    allow: Iterable[str] = ()
    resolver: Resolver = system_resolver
    entries: list[AllowEntry] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        for entry in self.allow or ():
            if not isinstance(entry, str) or not entry.strip():
                continue
            try:
                self.entries.append(parse_allow_entry(entry))
            except ValueError:
                continue

    @classmethod
    def coerce(cls, allow: EgressPolicy | Iterable[str] | None, resolver: Resolver | None = None) -> EgressPolicy:
        if isinstance(allow, EgressPolicy):
            if resolver is not None:
                return EgressPolicy(allow=allow.allow, resolver=resolver)
            return allow
        return cls(allow=tuple(allow or ()), resolver=resolver or system_resolver)

    def host_allowed(self, host: str, port: int | None = None) -> bool:
        """``port`` None asks about the name alone: only entries without a port match."""
        return any(e.allows_host(host, port) for e in self.entries)

    def ip_allowed(self, ip: IPAddress, port: int | None = None) -> bool:
        candidates: list[IPAddress] = [ip]
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            candidates.append(ip.ipv4_mapped)
        return any(e.allows_ip(c, port) for c in candidates for e in self.entries)

    # -- the check -----------------------------------------------------------------------

    def check(self, url: str | httpx.URL) -> ResolvedTarget:
        """Validate ``url`` and resolve its host once. Raises :class:`EgressDenied`."""
        text = str(url)
        scheme, host, port = _split(url)
        if scheme not in ALLOWED_SCHEMES:
            raise EgressDenied(text, f"scheme {scheme!r} is not allowed; tools may only call http or https URLs.")
        if not host:
            raise EgressDenied(text, "the URL has no host.")
        host_ok = self.host_allowed(host, port)
        literal = normalize_numeric_host(host)
        if literal is not None:
            addresses = [str(literal)]
            shown = host if literal.version == 6 or host == str(literal) else f"{host} (= {literal})"
        else:
            lowered = host.lower().rstrip(".")
            if not host_ok and (lowered == "localhost" or lowered.endswith(".localhost")):
                raise EgressDenied(text, f"{host} is a loopback address (this machine); {_ADVICE}")
            addresses = list(self.resolver(host, port))
            if not addresses:
                raise ResolutionError(f"could not resolve host {host!r}: no addresses")
            shown = host
        parsed: list[IPAddress] = []
        for address in addresses:
            ip = normalize_numeric_host(address)
            if ip is None:
                raise EgressDenied(text, f"{host} resolved to {address!r}, which is not an IP address.")
            parsed.append(ip)
        if not host_ok:
            for ip in parsed:
                if self.ip_allowed(ip, port):
                    continue
                why = classify_ip(ip)
                if why is None:
                    continue
                if literal is not None:
                    raise EgressDenied(text, f"{shown} is {_a(why)} {why}; {_ADVICE}")
                raise EgressDenied(text, f"{shown} resolves to {ip}, {_a(why)} {why}; {_ADVICE}")
        return ResolvedTarget(
            scheme=scheme, host=host, port=port, ip=str(parsed[0]), addresses=tuple(str(p) for p in parsed)
        )


def _split(url: str | httpx.URL) -> tuple[str, str, int]:
    """(scheme, host, port) without trusting httpx to accept odd numeric hosts."""
    if isinstance(url, httpx.URL):
        scheme = url.scheme.lower()
        host = url.raw_host.decode("ascii") if url.raw_host else ""
        port = url.port or (443 if scheme == "https" else 80)
        return scheme, host, port
    match = re.match(r"^\s*([A-Za-z][A-Za-z0-9+.\-]*):", url)
    scheme = match.group(1).lower() if match else ""
    if scheme not in ALLOWED_SCHEMES:
        return scheme, "", 0
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        # httpx refuses some spellings (e.g. 0177.0.0.1); inspect the raw authority ourselves.
        authority = re.sub(r"^[^:]+://", "", url.strip()).split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
        authority = authority.rsplit("@", 1)[-1]
        host, _, port_text = authority.rpartition(":") if not authority.endswith("]") else (authority, "", "")
        if not host:
            host, port_text = authority, ""
        default_port = 443 if scheme == "https" else 80
        return scheme, host, int(port_text) if port_text.isascii() and port_text.isdigit() and len(port_text) <= 5 else default_port
    return _split(parsed)


def check_url(
    url: str | httpx.URL, *, allow: EgressPolicy | Iterable[str] | None = None, resolver: Resolver | None = None
) -> ResolvedTarget:
    """Pre-flight check of a URL (the transport re-checks at connect time)."""
    return EgressPolicy.coerce(allow, resolver).check(url)


# --------------------------------------------------------------------------- transport


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation waits at most the time left until ``deadline``."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: float) -> None:
        self._inner = inner
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _time_left(self._deadline, timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _time_left(self._deadline, timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        left = _time_left(self._deadline, timeout, httpcore.ConnectTimeout)
        return DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, left), self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's network backend with every timeout cut to the time left until ``deadline`` (``time.monotonic()``)."""

    def __init__(self, inner: httpcore.NetworkBackend, deadline: float) -> None:
        self._inner = inner
        self._deadline = deadline

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = _time_left(self._deadline, timeout, httpcore.ConnectTimeout)
        return DeadlineStream(self._inner.connect_tcp(host, port, left, local_address, socket_options), self._deadline)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        left = _time_left(self._deadline, timeout, httpcore.ConnectTimeout)
        return DeadlineStream(self._inner.connect_unix_socket(path, left, socket_options), self._deadline)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(min(seconds, max(0.0, self._deadline - time.monotonic())))


def _time_left(deadline: float, timeout: float | None, error: type[Exception]) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the call's deadline has passed")
    return left if timeout is None else min(timeout, left)


def _bound_by_deadline(transport: httpx.HTTPTransport, deadline: float) -> None:
    """Put ``transport``'s connection pool on a :class:`DeadlineBackend` (httpx takes no backend argument)."""
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is None:  # pragma: no cover - an httpx/httpcore whose internals moved; the tests would say so
        raise RuntimeError("cannot bound this httpx transport by a deadline")
    pool._network_backend = DeadlineBackend(backend, deadline)  # type: ignore[union-attr]


#: What one exchange (or one MCP session) with a tenant's endpoint — its model provider, its MCP server — may
#: receive, decompressed: the endpoint is a tenant's input, and one endless or compressed-bomb answer would otherwise
#: fill a worker's memory.
TENANT_ANSWER_BYTES = 32 * 1024 * 1024


class ResponseTooLarge(httpx.ReadError):
    """A response body the client will not hand on: past its ``max_response_bytes`` (after decompression), in an
    encoding it cannot bound, or compressed and broken."""


class BodyBound:
    """Counts a response body against ``limit`` bytes (None: no bound), decoding gzip/deflate itself (``encoding``) a
    chunk at a time so the bound holds for what the caller reads, and stops it past ``deadline``
    (``time.monotonic()``, None: none). ``too_large(message)`` and ``too_slow(message)`` make the errors to raise.
    Shared by the sync and the async (MCP) transports."""

    ENCODINGS = ("", "identity", "gzip", "x-gzip", "deflate")

    def __init__(self, limit: int | None, encoding: str, too_large: Callable[[str], Exception], *,
                 deadline: float | None = None, too_slow: Callable[[str], Exception] | None = None) -> None:
        self.limit, self.size, self._too_large = limit, 0, too_large
        self.deadline, self._too_slow = deadline, too_slow or too_large
        self._decoder = None if encoding in ("", "identity") else zlib.decompressobj(
            16 + zlib.MAX_WBITS if encoding in ("gzip", "x-gzip") else zlib.MAX_WBITS)

    @classmethod
    def for_response(cls, headers: Any, limit: int | None, too_large: Callable[[str], Exception], *,
                     deadline: float | None = None, too_slow: Callable[[str], Exception] | None = None) -> BodyBound:
        """The bound of a response with these (mutable) headers: an encoding it cannot decode is refused
        (``too_large``); Content-Encoding and Content-Length are dropped, since the body is decoded here."""
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in cls.ENCODINGS:
            raise too_large(f"the response is encoded as {encoding!r}, which this client cannot bound (it asks for "
                            "identity and decodes gzip or deflate)")
        for name in ("content-encoding", "content-length"):
            if name in headers:
                del headers[name]
        return cls(limit, encoding, too_large, deadline=deadline, too_slow=too_slow)

    def _over(self) -> Exception:
        return self._too_large(f"the response is larger than {self.limit} bytes, this client's bound")

    def feed(self, chunk: bytes) -> bytes:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise self._too_slow("the response is still arriving past this client's time bound for one exchange")
        if self._decoder is not None:
            try:
                if self.limit is None:
                    chunk = self._decoder.decompress(chunk)
                else:
                    chunk = self._decoder.decompress(chunk, self.limit - self.size + 1)
            except zlib.error as exc:
                raise self._too_large(f"the response's compressed body is broken ({exc})") from None
            if self._decoder.unconsumed_tail:  # it would decompress to more than the bound
                raise self._over()
        self.size += len(chunk)
        if self.limit is not None and self.size > self.limit:
            raise self._over()
        return chunk

    def finish(self) -> bytes:
        if self._decoder is None:
            return b""
        tail = self._decoder.flush()
        self.size += len(tail)
        if self.limit is not None and self.size > self.limit:
            raise self._over()
        return tail


class _CappedStream(httpx.SyncByteStream):
    """A response body that stops at its ``BodyBound``."""

    def __init__(self, inner: httpx.SyncByteStream, bound: BodyBound) -> None:
        self._inner, self._bound = inner, bound

    def __iter__(self) -> Any:
        for chunk in self._inner:
            if out := self._bound.feed(chunk):
                yield out
        if tail := self._bound.finish():
            yield tail

    def close(self) -> None:
        self._inner.close()


def _capped(response: httpx.Response, limit: int | None, request: httpx.Request,
            deadline: float | None = None) -> httpx.Response:
    try:
        bound = BodyBound.for_response(response.headers, limit, lambda message: ResponseTooLarge(message, request=request),
                                       deadline=deadline,
                                       too_slow=lambda message: httpx.ReadTimeout(message, request=request))
    except ResponseTooLarge:
        response.close()
        raise
    response.stream = _CappedStream(response.stream, bound)  # type: ignore[arg-type]
    return response


class GuardedTransport(httpx.HTTPTransport):
    """An ``HTTPTransport`` that resolves each request's host once, validates every address,
    and connects to the validated IP. The ``Host`` header and TLS SNI keep the original name.

    Connections are pooled per (scheme, host name, port) so a TLS connection verified for one
    name is never reused for another name that happens to share an IP.
    """

    def __init__(
        self,
        *,
        allow: EgressPolicy | Iterable[str] | None = None,
        resolver: Resolver | None = None,
        deadline: float | None = None,
        max_response_bytes: int | None = None,
        max_exchange_seconds: float | None = None,
        **transport_kwargs: Any,
    ) -> None:
        transport_kwargs.pop("proxy", None)  # a proxy would make the pinned IP meaningless
        transport_kwargs.pop("uds", None)
        super().__init__(**transport_kwargs)
        self.policy = EgressPolicy.coerce(allow, resolver)
        #: ``time.monotonic()`` by which every exchange through this transport ends (None: the timeouts alone).
        self.deadline = deadline
        #: The largest response body this transport hands on, decompressed (None: no bound).
        self.max_response_bytes = max_response_bytes
        #: The longest one exchange may take from its request to its body's last byte, checked as the body arrives
        #: (None: no bound; each read still waits at most the client's timeout). Unlike ``deadline``, per request.
        self.max_exchange_seconds = max_exchange_seconds
        self._transport_kwargs = transport_kwargs
        self._pools: dict[tuple[str, str, int], httpx.HTTPTransport] = {}
        #: Every (host, ip, port) this transport connected to, in order (for tests and audit).
        self.connections: list[tuple[str, str, int]] = []

    def _pool_for(self, key: tuple[str, str, int]) -> httpx.HTTPTransport:
        pool = self._pools.get(key)
        if pool is None:
            pool = httpx.HTTPTransport(**self._transport_kwargs)
            if self.deadline is not None:
                _bound_by_deadline(pool, self.deadline)
            self._pools[key] = pool
        return pool

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.deadline is not None and time.monotonic() >= self.deadline:  # e.g. after a redirect: resolve nothing more
            raise httpx.ConnectTimeout("the call's deadline has passed", request=request)
        target = self.policy.check(request.url)
        pinned_url = request.url.copy_with(host=target.ip)
        extensions = dict(request.extensions)
        if target.scheme == "https":
            extensions.setdefault("sni_hostname", target.host)
        headers = httpx.Headers(request.headers)
        if "host" not in headers:
            headers["Host"] = request.url.netloc.decode("ascii")
        started = time.monotonic()
        if self.max_response_bytes is not None:
            headers["Accept-Encoding"] = "identity"  # a compressed body is decoded (and bounded) here if sent anyway
        pinned = httpx.Request(
            request.method, pinned_url, headers=headers, stream=request.stream, extensions=extensions
        )
        self.connections.append((target.host, target.ip, target.port))
        response = self._pool_for((target.scheme, target.host.lower(), target.port)).handle_request(pinned)
        if self.max_response_bytes is None and self.max_exchange_seconds is None:
            return response
        deadline = None if self.max_exchange_seconds is None else started + self.max_exchange_seconds
        return _capped(response, self.max_response_bytes, request, deadline)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        super().close()


class GuardedClient(httpx.Client):
    """``httpx.Client`` over :class:`GuardedTransport` that follows redirects itself.

    Each hop goes through the transport (which validates and pins the address); hops are
    limited to ``max_redirects``; ``Authorization``/``Cookie`` and any ``sensitive_headers`` are
    dropped when the origin changes; 301/302 (for POST) and 303 become GET without a body.
    """

    def __init__(
        self,
        *,
        allow: EgressPolicy | Iterable[str] | None = None,
        resolver: Resolver | None = None,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        follow_redirects: bool = True,
        sensitive_headers: Iterable[str] = (),
        transport_kwargs: dict[str, Any] | None = None,
        deadline: float | None = None,
        max_response_bytes: int | None = None,
        max_exchange_seconds: float | None = None,
        **client_kwargs: Any,
    ) -> None:
        for forbidden in ("transport", "mounts", "proxy", "trust_env", "follow_redirects"):
            client_kwargs.pop(forbidden, None)
        self.guard = GuardedTransport(allow=allow, resolver=resolver, deadline=deadline,
                                      max_response_bytes=max_response_bytes,
                                      max_exchange_seconds=max_exchange_seconds, **(transport_kwargs or {}))
        super().__init__(transport=self.guard, trust_env=False, follow_redirects=False, **client_kwargs)
        self.guard_follow_redirects = follow_redirects
        self.guard_max_redirects = max_redirects
        self.strip_on_cross_origin = CROSS_ORIGIN_STRIP | {h.lower() for h in sensitive_headers}

    def send(  # type: ignore[override]
        self,
        request: httpx.Request,
        *,
        stream: bool = False,
        auth: Any = httpx.USE_CLIENT_DEFAULT,
        follow_redirects: Any = httpx.USE_CLIENT_DEFAULT,
    ) -> httpx.Response:
        follow = self.guard_follow_redirects if follow_redirects is httpx.USE_CLIENT_DEFAULT else bool(follow_redirects)
        history: list[httpx.Response] = []
        while True:
            scheme = request.url.scheme.lower()
            if scheme not in ALLOWED_SCHEMES:
                raise EgressDenied(
                    str(request.url), f"scheme {scheme!r} is not allowed; tools may only call http or https URLs."
                )
            response = super().send(request, stream=stream, auth=auth, follow_redirects=False)
            if not follow or response.status_code not in REDIRECT_STATUSES or "location" not in response.headers:
                response.history = list(history)
                return response
            if len(history) >= self.guard_max_redirects:
                response.close()
                start = history[0].request.url if history else request.url
                raise httpx.TooManyRedirects(
                    f"more than {self.guard_max_redirects} redirects starting at {start}", request=request
                )
            next_request = self._next_request(request, response)
            response.close()
            history.append(response)
            request = next_request

    def _next_request(self, request: httpx.Request, response: httpx.Response) -> httpx.Request:
        location = response.headers["location"]
        try:
            url = request.url.join(location)
        except httpx.InvalidURL as exc:
            raise httpx.RemoteProtocolError(f"invalid redirect location {location!r}", request=request) from exc
        if url.fragment == "" and request.url.fragment:
            url = url.copy_with(fragment=request.url.fragment)
        method = request.method
        status = response.status_code
        if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
            method = "GET"
        headers = httpx.Headers(request.headers)
        headers.pop("host", None)
        same_origin = (url.scheme, url.raw_host, url.port) == (
            request.url.scheme,
            request.url.raw_host,
            request.url.port,
        )
        if not same_origin:
            for name in list(headers.keys()):
                if name.lower() in self.strip_on_cross_origin:
                    headers.pop(name, None)
        content: bytes | None = None
        if method != request.method and method == "GET":
            for name in ("content-length", "content-type", "transfer-encoding"):
                headers.pop(name, None)
        else:
            content = request.read()
        return httpx.Request(method, url, headers=headers, content=content, extensions=request.extensions)


def guarded_client(
    *,
    allow: EgressPolicy | Iterable[str] | None = None,
    timeout: float | httpx.Timeout = 10.0,
    resolver: Resolver | None = None,
    max_redirects: int = DEFAULT_MAX_REDIRECTS,
    follow_redirects: bool = True,
    sensitive_headers: Iterable[str] = (),
    deadline: float | None = None,
    max_response_bytes: int | None = None,
    max_exchange_seconds: float | None = None,
    **client_kwargs: Any,
) -> GuardedClient:
    """An egress-guarded ``httpx.Client``; use it as a context manager.

    ``deadline`` (``time.monotonic()``): no connect, read or write of this client waits past it.
    ``max_response_bytes``: a response body past it (decompressed) raises :class:`ResponseTooLarge` while it is read.
    ``max_exchange_seconds``: a body still arriving that long after its request raises ``httpx.ReadTimeout`` (a
    server that trickles a byte at a time, each within the read timeout, cannot hold the caller's thread).
    """
    return GuardedClient(
        allow=allow,
        resolver=resolver,
        max_redirects=max_redirects,
        follow_redirects=follow_redirects,
        sensitive_headers=sensitive_headers,
        deadline=deadline,
        max_response_bytes=max_response_bytes,
        max_exchange_seconds=max_exchange_seconds,
        timeout=timeout,
        **client_kwargs,
    )
