"""Issue #12: the environment is read in settings (config/settings.py through config/env.py), once, at start-up.

So a bad value stops start-up with a message naming the variable, and no module reads a variable settings do not
know. The few allowed exceptions set up a process before settings exist.
"""

from __future__ import annotations

import ast
import pathlib

import pytest
from django.core.exceptions import ImproperlyConfigured

from config import env
from tests.support.project import first_party_packages

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: path -> why it may touch os.environ
ALLOWED = {
    "config/env.py": "the one reader",
    "config/settings.py": "sets PROMETHEUS_MULTIPROC_DIR for the client library, which reads it itself",
    "config/celery.py": "DJANGO_SETTINGS_MODULE before settings load",
    "config/asgi.py": "DJANGO_SETTINGS_MODULE before settings load",
    "tools/isolation.py": "a child process finds its settings module before Django starts",
}


def _reads_environment(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and getattr(node.value, "id", "") == "os":
            lines.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.module == "os" and any(a.name in ("environ", "getenv") for a in node.names):
            lines.append(node.lineno)
    return lines


def test_no_module_outside_settings_reads_the_environment() -> None:
    offenders = []
    for app in first_party_packages():
        for path in (ROOT / app).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED:
                continue
            offenders += [f"{rel}:{line}" for line in _reads_environment(ast.parse(path.read_text()))]
    assert offenders == [], "read it in config/settings.py (config/env.py) and use settings.X"


@pytest.mark.parametrize(("reader", "name", "value", "message"), [
    (lambda n: env.env_port(n, 8000), "PORT", "80a", "TCP port"),
    (lambda n: env.env_port(n, 8000), "PORT", "70000", "TCP port"),
    (lambda n: env.env_choice(n, "warning", ("info", "warning")), "UVICORN_LOG_LEVEL", "loud", "one of info, warning"),
    (lambda n: env.env_json_object(n), "OPENAI_MODELS", "[1]", "JSON object"),
    (lambda n: env.env_json_object(n), "OPENAI_MODELS", "{nope", "JSON object"),
    (lambda n: env.env_prefixed("TOOL_SECRET_"), "TOOL_SECRET_bad-name", "x", "letters, digits and _"),
])
def test_a_bad_value_stops_start_up_naming_the_variable(monkeypatch: pytest.MonkeyPatch, reader: object, name: str,
                                                        value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=message) as caught:
        reader(name)  # type: ignore[operator]
    assert name in str(caught.value)


def test_prefixed_secrets_are_collected_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_SECRET_REFUNDS", "s3cr3t")
    monkeypatch.setenv("TOOL_SECRET_ORDERS_V2", "other")
    found = env.env_prefixed("TOOL_SECRET_")
    assert found["REFUNDS"] == "s3cr3t" and found["ORDERS_V2"] == "other"
