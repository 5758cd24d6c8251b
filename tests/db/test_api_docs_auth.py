"""The API's schema declares how to authenticate (Swagger UI's "Authorize"), and generating it warns about nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory, django_db_blocker: Any) -> dict[str, Any]:
    path = Path(tmp_path_factory.mktemp("schema")) / "schema.yml"
    with django_db_blocker.unblock():
        # --fail-on-warn: any drf-spectacular warning or error (e.g. an unknown authentication class) fails the command
        call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(path))
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def test_the_schema_declares_the_api_key_as_a_bearer_scheme(schema: dict[str, Any]) -> None:
    schemes = schema["components"]["securitySchemes"]
    assert schemes["apiKey"]["type"] == "http" and schemes["apiKey"]["scheme"] == "bearer"
    assert "aok_" in schemes["apiKey"]["description"]


def test_every_api_operation_accepts_the_api_key(schema: dict[str, Any]) -> None:
    operations = [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items()
                  if method in {"get", "post", "put", "patch", "delete"}]
    assert len(operations) > 20
    without = [f"{method.upper()} {path}" for path, method, op in operations
               if path.startswith("/api/v1/") and {"apiKey": []} not in op.get("security", [])]
    assert not without, without


def test_without_the_api_key_scheme_the_generation_fails_on_its_warnings(
    tmp_path: Path, django_db_blocker: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the fixture guards against: an authentication class drf-spectacular cannot describe is a warning per
    operation, and ``--fail-on-warn`` turns it into a failure."""
    from drf_spectacular.extensions import OpenApiAuthenticationExtension
    from drf_spectacular.management.commands.spectacular import SchemaGenerationError

    from tenants.schema import ApiKeyScheme

    registry = [ext for ext in OpenApiAuthenticationExtension._registry if ext is not ApiKeyScheme]
    monkeypatch.setattr(OpenApiAuthenticationExtension, "_registry", registry)
    with django_db_blocker.unblock(), pytest.raises(SchemaGenerationError):
        call_command("spectacular", "--fail-on-warn", "--file", str(tmp_path / "schema.yml"))
