from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from egress.guard import (
    EgressDenied,
    EgressPolicy,
    GuardedTransport,
    allow_list_problems,
    check_url,
    classify_ip,
    guarded_client,
    normalize_numeric_host,
    parse_allow_entry,
)
from tools.mcp_import import server_problems
from tools.serializers import config_problems


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


# --------------------------------------------------------------------------- allow-list entries that name a port


@pytest.mark.parametrize(
    ("entry", "allowed", "refused"),
    [
        ("127.0.0.1:8443", "http://127.0.0.1:8443/", "http://127.0.0.1:8444/"),
        ("svc.internal:8443", "https://svc.internal:8443/", "https://svc.internal/"),
        ("*.corp.example:8080", "http://a.corp.example:8080/", "http://a.corp.example:8081/"),
        ("10.0.4.0/24:8443", "http://10.0.4.9:8443/", "http://10.0.4.9:22/"),
        ("[::1]:443", "https://[::1]/", "http://[::1]/"),
        ("[fd00::]/8:443", "https://[fd00::7]/", "https://[fd00::7]:8443/"),
    ],
)
def test_an_allow_list_entry_with_a_port_applies_to_that_port_only(entry: str, allowed: str, refused: str) -> None:
    dns = fake_dns({"svc.internal": ["10.20.0.7"], "a.corp.example": ["10.9.9.9"]})
    assert check_url(allowed, allow=[entry], resolver=dns)
    with pytest.raises(EgressDenied):
        check_url(refused, allow=[entry], resolver=dns)


def test_an_entry_without_a_port_still_allows_every_port() -> None:
    for url in ("http://10.0.4.9/", "http://10.0.4.9:8443/"):
        assert check_url(url, allow=["10.0.4.0/24"], resolver=no_dns).ip == "10.0.4.9"
    assert check_url("http://[fd00::7]:9000/", allow=["fd00::/8"], resolver=no_dns)


def test_the_guarded_client_honours_the_port(local_server, connect_guard: list) -> None:
    with guarded_client(allow=[f"127.0.0.1:{local_server.port}"]) as client:
        assert client.get(f"{local_server.base}/echo/x").status_code == 200
    with guarded_client(allow=[f"127.0.0.1:{local_server.port + 1}"]) as client, pytest.raises(EgressDenied, match="loopback"):
        client.get(f"{local_server.base}/echo/x")
    assert connect_guard == [("127.0.0.1", local_server.port)]


def test_entries_parse_into_host_network_and_port() -> None:
    assert parse_allow_entry("API.Internal:8443").host == "api.internal" and parse_allow_entry("api.internal:8443").port == 8443
    assert str(parse_allow_entry("[fd00::/8]:443").network) == "fd00::/8" and parse_allow_entry("[fd00::/8]:443").port == 443
    assert parse_allow_entry("*.corp.example").suffix == ".corp.example" and parse_allow_entry("*.corp.example").port is None
    assert parse_allow_entry("::1").port is None  # a bare IPv6 address takes no port: write [::1]:443


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("10.0.4.0/24:99999", "the port must be a number from 1 to 65535, got '99999'"),
        ("host:", "the port must be a number from 1 to 65535"),
        ("10.0.0.0/33", "is not a valid IP address or CIDR range"),
        ("300.1.1.1:80", "is not a valid IP address or CIDR range"),
        ("https://api.example.com", "give a host, not a URL"),
        ("[127.0.0.1]:80", "brackets are for IPv6 addresses"),
        ("[::1]x", "only :port may follow ']'"),
        ("api example", "is not a valid host name"),
    ],
)
def test_a_bad_entry_is_explained(entry: str, says: str) -> None:
    problems = allow_list_problems(["api.internal", entry])
    assert len(problems) == 1 and says in problems[0] and entry in problems[0], problems
    assert "optionally with :port" in allow_list_problems("api.internal")[0]
    # the guard itself never lets a bad entry widen what is allowed
    with pytest.raises(EgressDenied):
        check_url("http://127.0.0.1:80/", allow=[entry], resolver=no_dns)


def test_a_tools_allow_hosts_entry_is_checked_when_saved() -> None:
    config = {"url": "https://api.example.com/orders", "allow_hosts": ["10.0.4.0/24:8443", "10.0.4.0/24:0"]}
    problems = config_problems("http", config, {"type": "object", "properties": {}}, tenant=None, current=config)
    assert problems["allow_hosts"] == ["'10.0.4.0/24:0': the port must be a number from 1 to 65535, got '0'"]
    server = {"url": "https://mcp.example.com/mcp", "allow_hosts": ["[fd00::1]:443", "[fd00::1]:https"]}
    assert server_problems(server) == ["\"allow_hosts\": '[fd00::1]:https': the port must be a number from 1 to 65535, got 'https'"]


@pytest.mark.parametrize("variable", ["TOOL_EGRESS_ALLOW", "PROVIDER_EGRESS_ALLOW"])
def test_a_bad_allow_list_setting_stops_start_up_naming_the_variable(variable: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "TOOL_EGRESS_ALLOW", "PROVIDER_EGRESS_ALLOW")}
    env.update({"DEBUG": "false", "SECRET_KEY": "k" * 50, variable: "10.0.4.0/24:8443, 10.0.4.0/24:70000"})
    root = Path(__file__).resolve().parents[3]
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"{variable} (comma-separated): '10.0.4.0/24:70000': the port must be a number from 1 to 65535" in result.stderr
    env[variable] = "10.0.4.0/24:8443,[fd00::1]:443,api.internal:8080"
    assert subprocess.run([sys.executable, "manage.py", "check"], cwd=root, env=env, capture_output=True, timeout=120).returncode == 0
