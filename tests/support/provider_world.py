"""A test world whose agent's model is served by a local OpenAI-compatible server, registered through the API."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from agents import model_clients
from tests.factories import World, make_world
from tests.support.fake_openai import FakeOpenAI


def world_with_provider(settings: Any, fake: FakeOpenAI, *, api_key: str, models: dict[str, Any], model: str,
                        name: str = "acme") -> World:
    """``make_world(model=model)`` with the provider ``name`` at ``fake`` (egress to 127.0.0.1 allowed, for the
    provider and for tools)."""
    settings.PROVIDER_EGRESS_ALLOW = ["127.0.0.1"]
    settings.TOOL_EGRESS_ALLOW = ["127.0.0.1"]
    model_clients.clear_cache()
    world = make_world(model=model)
    client = APIClient()
    client.force_authenticate(world.operator)
    made = client.post("/api/v1/providers", {"name": name, "base_url": fake.base_url, "api_key": api_key, "models": models},
                       format="json")
    assert made.status_code == 201, made.content
    return world
