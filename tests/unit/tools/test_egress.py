from __future__ import annotations

import ipaddress

import httpx
import pytest

from tools.egress import (
    EgressDenied,
    EgressPolicy,
    GuardedTransport,
    check_url,
    classify_ip,
    guarded_client,
    normalize_numeric_host,
)


def no_dns(host: str, port: int) -> list[str]:
    raise AssertionError(f"the resolver must not be asked about {host!r}")


def fake_dns(table: dict[str, list[str]]):
    calls: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        calls.append(host)
        return list(table[host])

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


BLOCKED = [
    ("http://127.0.0.1/", "loopback"),
    ("http://localhost/", "loopback"),
    ("http://LOCALHOST./admin", "loopback"),
    ("http://api.localhost/", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "IPv4-mapped form of 127.0.0.1"),
    ("http://2130706433/", "2130706433 (= 127.0.0.1) is a loopback"),
    ("http://0x7f000001/", "0x7f000001 (= 127.0.0.1) is a loopback"),
    ("http://0177.0.0.1/", "(= 127.0.0.1) is a loopback"),
    ("http://127.1/", "(= 127.0.0.1)"),
    ("http://169.254.169.254/latest/meta-data/", "link-local address (cloud metadata)"),
    ("http://10.0.0.5/", "private"),
    ("http://172.16.3.4/", "private"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://192.168.1.1/", "private"),
    ("http://0.0.0.0/", "unspecified"),
    ("http://224.0.0.1/", "multicast"),
    ("http://240.0.0.1/", "reserved"),
    ("http://[fc00::1]/", "unique local"),
    ("http://[fe80::1]/", "link-local"),
    ("http://[2002:a00:1::]/", "6to4 form of 10.0.0.1"),
    ("http://[64:ff9b::a9fe:a9fe]/", "NAT64 form of 169.254.169.254"),
    ("https://[fd00:ec2::254]/", "cloud metadata"),
]


@pytest.mark.parametrize(("url", "why"), BLOCKED)
def test_check_url_blocks_internal_targets(url: str, why: str) -> None:
    with pytest.raises(EgressDenied) as info:
        check_url(url, resolver=no_dns)
    assert why in info.value.reason
    assert "Ask an operator to allow-list it" in info.value.reason
    assert info.value.url == url


def test_metadata_reason_is_readable() -> None:
    with pytest.raises(EgressDenied) as info:
        check_url("http://169.254.169.254/latest/meta-data/", resolver=no_dns)
    assert info.value.reason == (
        "169.254.169.254 is a link-local address (cloud metadata); outbound calls from tools may not reach it. "
        "Ask an operator to allow-list it if this is intended."
    )


def test_hostname_resolving_to_private_address_is_blocked() -> None:
    dns = fake_dns({"intranet.example.com": ["93.184.216.34", "10.1.2.3"]})
    with pytest.raises(EgressDenied) as info:
        check_url("https://intranet.example.com/x", resolver=dns)
    assert "intranet.example.com resolves to 10.1.2.3, a private address" in info.value.reason


def test_public_hostname_passes_and_scheme_is_checked() -> None:
    dns = fake_dns({"api.example.com": ["93.184.216.34"]})
    target = check_url("https://api.example.com:8443/v1", resolver=dns)
    assert (target.scheme, target.host, target.port, target.ip) == ("https", "api.example.com", 8443, "93.184.216.34")
    for url in ("file:///etc/passwd", "gopher://x/", "ftp://api.example.com/"):
        with pytest.raises(EgressDenied, match="only call http or https"):
            check_url(url, resolver=dns)


def test_allow_list_by_cidr_and_host() -> None:
    assert check_url("http://127.0.0.1:9/", allow=["127.0.0.1/32"], resolver=no_dns).ip == "127.0.0.1"
    with pytest.raises(EgressDenied):
        check_url("http://127.0.0.2/", allow=["127.0.0.1/32"], resolver=no_dns)
    dns = fake_dns({"svc.internal": ["10.20.0.7"], "a.corp.example": ["10.9.9.9"]})
    assert check_url("http://svc.internal/", allow=["svc.internal"], resolver=dns).ip == "10.20.0.7"
    assert check_url("http://a.corp.example/", allow=["*.corp.example"], resolver=dns).ip == "10.9.9.9"
    assert check_url("http://svc.internal/", allow=["10.20.0.0/16"], resolver=dns).ip == "10.20.0.7"
    # the mapped IPv6 form of an allow-listed IPv4 address is allowed too
    assert check_url("http://[::ffff:127.0.0.1]/", allow=["127.0.0.1/32"], resolver=no_dns)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("10.0.1", "10.0.0.1"),
        ("[::1]", "::1"),
        ("example.com", None),
        ("1.2.3.4.5", None),
        ("09.1.1.1", None),
        ("256.1.1.1", None),
        ("deadbeef", None),
    ],
)
def test_normalize_numeric_host(host: str, expected: str | None) -> None:
    result = normalize_numeric_host(host)
    assert (str(result) if result is not None else None) == expected


def test_classify_public_addresses_pass() -> None:
    for ip in ("8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8"):
        assert classify_ip(ipaddress.ip_address(ip)) is None


# --------------------------------------------------------------------------- through the client

CLIENT_BLOCKED = [u for u, _ in BLOCKED if "0177" not in u]


@pytest.mark.parametrize("url", CLIENT_BLOCKED)
def test_guarded_client_blocks_before_connecting(url: str, connect_guard: list) -> None:
    with guarded_client(resolver=no_dns) as client, pytest.raises(EgressDenied):
        client.get(url)
    assert connect_guard == []


def test_guarded_client_octal_host_never_connects(connect_guard: list) -> None:
    with guarded_client(resolver=no_dns) as client, pytest.raises((EgressDenied, httpx.InvalidURL)):
        client.get("http://0177.0.0.1/")
    assert connect_guard == []


def test_guarded_client_blocks_hostname_resolving_to_private(connect_guard: list) -> None:
    dns = fake_dns({"internal.corp": ["10.0.0.7"]})
    with guarded_client(resolver=dns) as client, pytest.raises(EgressDenied, match=r"resolves to 10\.0\.0\.7"):
        client.get("http://internal.corp/admin")
    assert connect_guard == []


def test_allow_listed_loopback_works(local_server, connect_guard: list) -> None:
    with guarded_client(allow=["127.0.0.1/32"]) as client:
        response = client.get(f"{local_server.base}/echo/hello")
    assert response.status_code == 200
    assert response.json()["path"] == "/echo/hello"
    assert connect_guard == [("127.0.0.1", local_server.port)]


def test_loopback_without_allow_list_is_denied(local_server, connect_guard: list) -> None:
    with guarded_client() as client, pytest.raises(EgressDenied, match="loopback"):
        client.get(f"{local_server.base}/echo/hello")
    assert connect_guard == []


def test_redirect_to_metadata_is_blocked_before_connecting(local_server, connect_guard: list) -> None:
    with guarded_client(allow=["127.0.0.1/32"], resolver=no_dns) as client, pytest.raises(EgressDenied) as info:
        client.get(f"{local_server.base}/redirect-metadata")
    assert "169.254.169.254" in info.value.reason and "cloud metadata" in info.value.reason
    assert info.value.url.startswith("http://169.254.169.254/")
    # only the allowed first hop was ever connected to
    assert connect_guard == [("127.0.0.1", local_server.port)]


def test_same_host_redirect_followed_and_limited(local_server) -> None:
    with guarded_client(allow=["127.0.0.1/32"]) as client:
        response = client.get(f"{local_server.base}/redirect-local")
        assert response.status_code == 200
        assert response.json()["path"] == "/echo/after-redirect"
        assert len(response.history) == 1
    with guarded_client(allow=["127.0.0.1/32"], max_redirects=2) as client, pytest.raises(httpx.TooManyRedirects):
        client.get(f"{local_server.base}/redirect-loop")
    with guarded_client(allow=["127.0.0.1/32"], follow_redirects=False) as client:
        assert client.get(f"{local_server.base}/redirect-local").status_code == 302


def test_dns_rebinding_connects_only_to_the_validated_address(connect_guard: list) -> None:
    """Public first, loopback second: the connection uses the address that was validated."""
    answers = [["93.184.216.34"], ["127.0.0.1"]]
    calls: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return answers[min(len(calls) - 1, 1)]

    with guarded_client(resolver=rebinding) as client:
        with pytest.raises(httpx.ConnectError):  # the test guard refuses 93.184.216.34 without any traffic
            client.get("http://rebind.example:8080/")
        assert client.guard.connections == [("rebind.example", "93.184.216.34", 8080)]
    assert calls == ["rebind.example"]  # resolved exactly once
    assert connect_guard == [("93.184.216.34", 8080)]  # never 127.0.0.1


def test_dns_rebinding_allowed_target_keeps_host_header(local_server, connect_guard: list) -> None:
    answers = [["127.0.0.1"], ["10.0.0.5"]]
    calls: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return answers[min(len(calls) - 1, 1)]

    with guarded_client(allow=["127.0.0.1/32"], resolver=rebinding) as client:
        response = client.get(f"http://svc.test:{local_server.port}/echo/pinned")
    assert response.status_code == 200
    assert response.json()["headers"]["host"] == f"svc.test:{local_server.port}"
    assert calls == ["svc.test"]
    assert connect_guard == [("127.0.0.1", local_server.port)]


def test_transport_pins_ip_and_sets_sni(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[httpx.Request] = []

    class Fake(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(200, text="ok")

    transport = GuardedTransport(resolver=fake_dns({"api.example.com": ["93.184.216.34"]}))
    monkeypatch.setattr(transport, "_pool_for", lambda key: Fake())
    with httpx.Client(transport=transport, trust_env=False) as client:
        assert client.get("https://api.example.com/v1/x?q=1").text == "ok"
    (pinned,) = seen
    assert pinned.url.host == "93.184.216.34"
    assert pinned.url.raw_path == b"/v1/x?q=1"
    assert pinned.headers["host"] == "api.example.com"
    assert pinned.extensions["sni_hostname"] == "api.example.com"


def test_policy_object_is_reusable() -> None:
    policy = EgressPolicy(allow=["127.0.0.1/32"], resolver=no_dns)
    assert check_url("http://127.0.0.1/", allow=policy).ip == "127.0.0.1"
    with pytest.raises(EgressDenied):
        check_url("http://10.0.0.1/", allow=policy)
