"""``manage.py check --deploy`` is clean with the production settings the README documents (and not without them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The README's production settings (section "Production mode"); a TLS-terminating proxy in front of the server.
PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": "f3Kq9-production-like-secret-key-with-enough-entropy-8vZ2pLr7",
    "ALLOWED_HOSTS": "console.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://console.example.com",
    "METRICS_TOKEN": "scrape-token-0123456789abcdef",
    "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
}


def _check(extra: dict[str, str], drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in PRODUCTION and k not in drop and k != "HTTPS_ONLY"}
    env.update(PRODUCTION, AGENTOPS_VAR_DIR=str(ROOT / "var" / "deploy-check"), **extra)
    for name in drop:
        env.pop(name, None)
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_documented_production_settings_pass_the_deploy_check_with_no_warning() -> None:
    result = _check({})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNINGS" not in result.stdout + result.stderr and "System check identified no issues" in result.stdout


def test_plain_http_or_an_open_metrics_endpoint_is_reported() -> None:
    result = _check({"HTTPS_ONLY": "false"}, drop=("METRICS_TOKEN",))
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016", "agentops.W001"):
        assert warning in result.stdout + result.stderr, warning
