"""Issue #12: one DomainError family, mapped to HTTP once (core.api), in one error body for every API error.

Every error answers ``{"error": {"code", "message", "field"}}`` (plus DRF's keys for older clients); the services'
refusals are DomainErrors, and no API module catches one to translate it by hand.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents.acceptance import KeyReused
from agents.attention import AttentionRefused
from agents.erasure import ErasureRefused
from agents.models import RunStatus
from agents.provider_services import ProviderInvalid, ProviderRefused
from agents.services import RunRefused, VersionLocked
from approvals.decisions import ApprovalRefused
from core.errors import DomainError
from marketplace.services import InvalidConfig, InvalidWeights, MarketplaceError, NotAllowed
from tests.e2e.builders import make_run
from tests.factories import make_world
from tests.support.project import first_party_apps
from tools.services import ToolRefused

ROOT = pathlib.Path(__file__).resolve().parents[2]


def client_for(raw_key: str | None) -> APIClient:
    client = APIClient()
    if raw_key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def error_of(response: Any, status: int, code: str, field: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert set(error) >= {"code", "message", "field"}, error
    assert error["code"] == code and error["field"] == field, error
    assert isinstance(error["message"], str) and len(error["message"]) > 10, error
    return dict(error)


@pytest.mark.django_db
def test_service_refusals_answer_in_the_one_body_with_the_status_that_fits() -> None:
    world = make_world()
    api = client_for(world.raw_key)

    # a field at fault: 400, named (and DRF's key beside it)
    dup = api.post("/api/v1/agents", {"slug": world.agent.slug, "name": "again"}, format="json")
    error = error_of(dup, 400, "invalid", "slug")
    assert dup.json()["slug"] == [error["message"]] and world.agent.slug in error["message"]

    # the object's state: 409, with ``detail`` beside it
    finished = make_run(world, status=RunStatus.FINISHED)
    cancel = api.post(f"/api/v1/runs/{finished.pk}/cancel")
    error = error_of(cancel, 409, "conflict")
    assert cancel.json()["detail"] == error["message"] and "already finished" in error["message"]

    used = world.version.tools[0]
    delete = api.delete(f"/api/v1/tools/{used}")
    assert "uses" in error_of(delete, 409, "conflict")["message"]

    # a role that does not allow it: 403
    created = api.post("/api/v1/plugin-installs", {"plugin": "order-desk"}, format="json")
    assert created.status_code == 201, created.content
    consent = api.post(f"/api/v1/plugin-installs/{created.json()['id']}/accept-consent")
    assert "need the role owner" in error_of(consent, 403, "forbidden")["message"]

    # several problems in one document: all listed under the field, the first in ``error``
    weights = api.put(f"/api/v1/releases/{world.agent.slug}", {"weights": {"v1": 90, "v9": 10}}, format="json")
    error = error_of(weights, 400, "invalid", "weights")
    assert error["message"] in " ".join(weights.json()["weights"])


@pytest.mark.django_db
def test_an_idempotency_key_reused_with_another_body_is_a_422_in_the_one_body() -> None:
    world = make_world()
    api = client_for(world.raw_key)
    headers = {"HTTP_IDEMPOTENCY_KEY": "order-42"}
    first = api.post("/api/v1/runs", {"agent": world.agent.slug, "input": "where is O1?"}, format="json", **headers)
    assert first.status_code == 202, first.content
    again = api.post("/api/v1/runs", {"agent": world.agent.slug, "input": "something else"}, format="json", **headers)
    error_of(again, 422, "idempotency_key_reused")


@pytest.mark.django_db
def test_drf_and_django_errors_answer_in_the_one_body_too() -> None:
    world, other = make_world(), make_world()
    api = client_for(world.raw_key)

    missing = api.post("/api/v1/runs", {"agent": world.agent.slug}, format="json")
    assert missing.json()["input"] == [error_of(missing, 400, "invalid", "input")["message"]]

    unknown = api.post("/api/v1/runs", {"agent": "nope", "input": "hi"}, format="json")
    assert "Known agents" in error_of(unknown, 400, "invalid", "agent")["message"]

    nested = api.post("/api/v1/runs", {"agent": world.agent.slug, "input": "hi", "facts": {"": 1}}, format="json")
    assert "a letter first" in error_of(nested, 400, "invalid", "facts")["message"]

    error_of(client_for(None).get("/api/v1/runs"), 401, "not_authenticated")
    error_of(client_for("aok_not-a-key").get("/api/v1/runs"), 401, "authentication_failed")

    foreign = make_run(other)
    error_of(api.get(f"/api/v1/runs/{foreign.pk}"), 404, "not_found")
    error_of(api.post(f"/api/v1/runs/{foreign.pk}/cancel"), 404, "not_found")
    error_of(api.get("/api/v1/no-such-endpoint"), 404, "not_found")


@pytest.mark.django_db
def test_the_openapi_schema_documents_the_error_object() -> None:
    world = make_world()
    schema = client_for(world.raw_key).get("/api/schema/", HTTP_ACCEPT="application/json").json()
    components = schema["components"]["schemas"]
    for name in ("Error", "ValidationError"):
        assert "error" in components[name]["required"], name
        assert components[name]["properties"]["error"]["required"] == ["code", "message", "field"]
    cancel = schema["paths"]["/api/v1/runs/{id}/cancel"]["post"]["responses"]["409"]
    assert cancel["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/Error"


REFUSALS = [RunRefused, ToolRefused, AttentionRefused, ErasureRefused, ProviderRefused, ProviderInvalid, MarketplaceError,
            NotAllowed, InvalidConfig, InvalidWeights, ApprovalRefused, KeyReused, VersionLocked]


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda cls: cls.__name__)
def test_every_service_refusal_is_a_domain_error(refusal: type[Exception]) -> None:
    assert issubclass(refusal, DomainError)


def _api_modules() -> list[pathlib.Path]:
    return [path for app in first_party_apps() for path in (ROOT / app).glob("*.py")
            if path.name == "api.py" or path.name.endswith("_api.py")]


def test_no_api_module_translates_a_domain_error_by_hand() -> None:
    """The map is in core.api, once: an ``except`` naming a refusal in an API module is a second map."""
    names = {cls.__name__ for cls in REFUSALS} | {"DomainError"}
    offenders = []
    modules = _api_modules()
    assert len(modules) >= 6
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                caught = [n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "") for n in ast.walk(node.type)]
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno} catches {name}" for name in caught if name in names]
    assert offenders == []
