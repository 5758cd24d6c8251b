"""The live stack whose OpenAI-compatible provider is the local streaming test server (tests/support/fake_openai.py),
reached by the worker over HTTP through the openai SDK: the fixtures the streaming tests share (SSE and the websocket,
the Python client, the playground in Chromium).

A plugin of the root conftest: a module asks for ``fake``, ``stack`` or ``worlds`` (a module's own fixture of the same
name wins), and may set ``STREAM_STACK_ENV`` (a dict of settings) for a setting of its own, e.g. a create throttle.
They are module-scoped: each module has its own provider and stack.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.factories import World, make_world
from tests.support.fake_openai import FakeOpenAI, text
from tests.support.live_stack import LiveStack, make_live_stack

KEY = "sk-live-stream-key-0123456789abcdefXYZ"
MODEL = "gpt-4o-mini"
MODELS = {MODEL: {"context_window": 128000, "price_in_per_1m": 0.15, "price_out_per_1m": 0.6}}
WORDS = " ".join(f"word{i}" for i in range(60))  # ~420 characters: deltas flow long before the reply ends


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI(api_key=KEY, models=[MODEL], default=text("OK")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, django_db_setup: Any, django_db_blocker: Any, fake: FakeOpenAI) -> Iterator[LiveStack]:
    live = make_live_stack({
        "OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": KEY, "OPENAI_MODEL": MODEL,
        "OPENAI_MODELS": json.dumps(MODELS), "SSE_KEEPALIVE_SECONDS": "1",
        **getattr(request.module, "STREAM_STACK_ENV", {}),
    })
    try:
        yield live
    finally:
        live.stop()


def openai_world(django_db_blocker: Any, model: str = f"openai/{MODEL}") -> World:
    """A tenant of its own (its key, its agent) whose agent's model is the streaming provider."""
    with django_db_blocker.unblock():
        return make_world(model=model)


@pytest.fixture(scope="module")
def worlds(stack: LiveStack, django_db_blocker: Any) -> tuple[World, World]:
    """Two tenants on the streaming provider: the second attacks the first's runs."""
    return openai_world(django_db_blocker), openai_world(django_db_blocker)
