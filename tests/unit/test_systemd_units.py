"""Issue #50: the supervisor recipe in deploy/systemd restarts every process kind, and runs the commands we ship."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNITS / name)
    return parser


@pytest.mark.parametrize(("name", "command"), [
    ("agentops-server.service", "manage.py serve --no-worker"),
    ("agentops-worker@.service", "celery -A config worker"),
    ("agentops-beat.service", "celery -A config beat"),
])
def test_each_process_kind_is_restarted_whenever_it_exits(name: str, command: str) -> None:
    unit = _unit(name)
    assert unit["Service"]["Restart"] == "always"
    assert command in unit["Service"]["ExecStart"]
    assert unit["Service"]["EnvironmentFile"] == "/etc/agentops/env"


def test_the_server_command_the_unit_runs_accepts_its_options() -> None:
    from django.core.management import load_command_class

    parser = load_command_class("config", "serve").create_parser("manage.py", "serve")
    options = parser.parse_args(["--no-worker", "--port", "8000"])
    assert options.port == 8000
