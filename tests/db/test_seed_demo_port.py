"""seed_demo's curl example points where ``manage.py serve`` listens: PORT, and HOST unless it is a wildcard."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from tests.support.deployment import set_env


@pytest.mark.django_db
@pytest.mark.parametrize(("host", "port", "url"), [
    ("0.0.0.0", 9123, "http://127.0.0.1:9123/api/v1/runs"),
    ("console.internal", 8443, "http://console.internal:8443/api/v1/runs"),
    ("::1", 8001, "http://[::1]:8001/api/v1/runs"),
])
def test_the_curl_example_uses_the_served_host_and_port(
    host: str, port: int, url: str, settings: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    set_env(settings, "DEMO_API_KEY", "aok_0123abcd_fixed-demo-key-for-tests")
    set_env(settings, "DEMO_PASSWORD", "fixed-demo-password")
    settings.SERVE_HOST, settings.SERVE_PORT = host, port
    call_command("seed_demo")
    out = capsys.readouterr().out
    assert url in out, out
    assert out.count("/api/v1/runs") == 1
