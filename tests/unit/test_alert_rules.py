"""The shipped alert rules and dashboard queries pass ``promtool`` (Debian's prometheus package; CI installs it).

Locally the test skips only when promtool is missing and CI is unset; in CI a missing promtool fails it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.dashboards import ALERT_TESTS, ALERTS, dashboard_expressions, with_grafana_values

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        message = "promtool is missing: apt-get install -y prometheus (Debian's package; the service need not run)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_the_alert_rules_pass_promtool_check(promtool: str) -> None:
    result = _run(promtool, "check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_alert_rules_fire_and_stay_quiet_as_their_unit_tests_expect(promtool: str) -> None:
    result = _run(promtool, "test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_catches_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"alert": "X", "expr": "sum by (agent (agentops_runs_total)"}]}]}))
    result = _run(promtool, "check", "rules", str(broken))
    assert result.returncode != 0


def test_every_dashboard_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    """Each panel's query, with Grafana's variables given values, as a recording rule: promtool parses them all."""
    exprs = dashboard_expressions()
    assert len(exprs) >= 25
    rules = [{"record": f"agentops:dashboard_query_{i}", "expr": with_grafana_values(expr)} for i, expr in enumerate(exprs)]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = _run(promtool, "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
