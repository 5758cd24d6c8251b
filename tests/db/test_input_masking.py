"""A card number and a password typed into a run are masked before they are stored or reach the model.

Given a run posted through the API, then the API, the console, the admin, the session's conversation
and every model request see the masked input; a version may keep named personal data raw (an audited
opt-in), never cards or secrets.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from agents import model_clients, services
from agents.models import AgentVersion, Run, RunMessage, Session, Turn
from audit.models import ConfigChange
from runtime.scripted import ScriptedModel, say
from runtime.types import ModelRequest, ModelResponse
from tests.factories import World
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db

CARD, PASSWORD, PHONE = "4111 1111 1111 1111", "hunter2secret", "13812345678"
TEXT = f"my card is {CARD} and password: {PASSWORD}"
MASKED = "my card is **** **** **** 1111 and password: ******"


@pytest.fixture
def api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


class Recording:
    """A model client that records every request before the real (or scripted) client answers it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[ModelRequest] = []

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return self.inner.complete(request)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], Recording]:
    """Route the runs' model calls through one recorder; ``None`` wraps the real client (the demo planner)."""
    real = model_clients.model_client_for

    def use(inner: Any) -> Recording:
        recorder = Recording(inner)

        def client_for(run: Any) -> Recording:
            if inner is None:
                recorder.inner = real(run)
            return recorder

        monkeypatch.setattr(model_clients, "model_client_for", client_for)
        return recorder

    return use


def _sent(recorder: Recording) -> str:
    return json.dumps([request.messages for request in recorder.requests], ensure_ascii=False)


def _post(api: APIClient, text: str, **body: Any) -> dict[str, Any]:
    response = api.post("/api/v1/runs", {"agent": "order-assistant", "input": text, **body}, format="json")
    assert response.status_code == 202, response.content
    return dict(response.json())


def test_the_input_is_stored_and_shown_masked_in_the_api_console_and_admin(world: World, api: APIClient) -> None:
    # given a run whose input holds a payment card and a password
    body = _post(api, TEXT)
    # then the row, the API's answer and its GET hold the masked text only
    run = Run.objects.get(pk=body["id"])
    assert run.input == MASKED and body["input"] == MASKED
    fetched = api.get(f"/api/v1/runs/{run.pk}")
    assert fetched.status_code == 200 and fetched.json()["input"] == MASKED
    # and the console's run page and the admin's change page show no raw card or password
    browser = Client()
    browser.force_login(world.operator)
    for path in (f"/console/runs/{run.pk}/", f"/admin/agents/run/{run.pk}/change/", "/console/runs/"):
        page = browser.get(path)
        assert page.status_code == 200, path
        html = page.content.decode()
        assert PASSWORD not in html and CARD not in html and "4111111111111111" not in html, path
    assert "**** **** **** 1111" in browser.get(f"/admin/agents/run/{run.pk}/change/").content.decode()


def test_facts_are_masked_before_they_are_stored(world: World, api: APIClient) -> None:
    body = _post(api, "hello", facts={"note": f"password: {PASSWORD}", "card_number": "4111111111111111", "customer": "li"})
    facts = Run.objects.get(pk=body["id"]).facts
    assert PASSWORD not in json.dumps(facts) and "4111111111111111" not in json.dumps(facts)
    assert facts["customer"] == "li" and facts["card_number"].endswith("1111")


def test_the_model_never_sees_the_raw_card_or_password_and_the_session_keeps_it_masked(
    world: World, api: APIClient, recording: Callable[[Any], Recording]
) -> None:
    # given two runs of one session with a scripted model that records its requests
    recorder = recording(ScriptedModel([say("Noted."), say("You told me before.")]))
    first = _post(api, TEXT)
    services.execute_run(first["id"])
    second = _post(api, "what did I tell you?", session=first["session"])
    services.execute_run(second["id"])
    # then no request carried the raw values, though the masked question and its history did
    assert len(recorder.requests) == 2
    sent = _sent(recorder)
    assert PASSWORD not in sent and CARD not in sent and MASKED in sent
    # and the conversation the session keeps (turns, message log) is masked too
    stored = json.dumps([*Turn.objects.values_list("user_message", flat=True),
                         *RunMessage.objects.values_list("message", flat=True)], ensure_ascii=False)
    assert PASSWORD not in stored and CARD not in stored and MASKED in stored


def test_rows_stored_raw_before_masking_still_reach_the_model_masked(world: World, recording: Callable[[Any], Recording]) -> None:
    # given a session whose earlier turn and a queued run were stored raw (before input masking, or by another path)
    recorder = recording(ScriptedModel([say("Noted.")]))
    session = Session.objects.create(tenant=world.tenant, agent=world.agent, turns=1)
    earlier = Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session,
                                 input=TEXT, status="finished")
    Turn.objects.create(tenant=world.tenant, session=session, turn_seq=1, run=earlier, user_message=TEXT, assistant_message="ok")
    run = Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input=f"again: {TEXT}")
    # when it runs
    services.execute_run(str(run.pk))
    # then the model saw the question and the history masked
    sent = _sent(recorder)
    assert PASSWORD not in sent and CARD not in sent and f"again: {MASKED}" in sent and sent.count(MASKED) == 2


def test_the_demo_planner_still_reads_the_order_id_from_a_masked_input(
    world: World, api: APIClient, recording: Callable[[Any], Recording]
) -> None:
    # given the demo walkthrough's question with a card number and a password in it
    recorder = recording(None)
    body = _post(api, f"where is order O202411280001? {TEXT}")
    services.execute_run(body["id"])
    run = Run.objects.get(pk=body["id"])
    # then the planner found the order (it is in the answer) and never saw the raw values
    assert run.terminal_reason == "final_answer", run.error
    assert "O202411280001" in run.output
    assert recorder.requests and PASSWORD not in _sent(recorder) and CARD not in _sent(recorder)


def test_a_version_may_opt_in_to_raw_phone_numbers_which_is_audited_but_cards_stay_masked(
    world: World, api: APIClient, recording: Callable[[Any], Recording]
) -> None:
    # given an operator who creates a version keeping phone numbers raw in run input
    response = api.post("/api/v1/agents/order-assistant/versions", {
        "model": "demo/planner", "tools": world.version.tools, "make_current": True,
        "policy": {"input_masking": {"raw": ["phone"]}},
    }, format="json")
    assert response.status_code == 201, response.content
    version = AgentVersion.objects.get(agent=world.agent, number=response.json()["number"])
    # then the choice is a config-change audit row of its own
    row = ConfigChange.objects.get(tenant=world.tenant, action="agent_version.raw_input")
    assert row.target_id == str(version.pk) and row.details["raw"] == ["phone"]
    # and its runs keep the phone number but not the card or the password, in the row and the model request
    recorder = recording(ScriptedModel([say("Will call.")]))
    body = _post(api, f"call me on {PHONE}; {TEXT}")
    assert PHONE in body["input"] and PASSWORD not in body["input"] and CARD not in body["input"]
    services.execute_run(body["id"])
    assert PHONE in _sent(recorder) and PASSWORD not in _sent(recorder)
    # while a version without the opt-in masks the phone number
    world.agent.current_version = world.version
    world.agent.save(update_fields=["current_version"])
    assert PHONE not in _post(api, f"call me on {PHONE}", session=None)["input"]


def test_cards_and_passwords_cannot_be_opted_out_and_removing_the_opt_in_is_audited(world: World, api: APIClient) -> None:
    refused = api.post("/api/v1/agents/order-assistant/versions",
                       {"model": "demo/planner", "policy": {"input_masking": {"raw": ["card", "password"]}}}, format="json")
    assert refused.status_code == 400 and "input_masking.raw" in refused.json()["policy"][0]
    created = api.post("/api/v1/agents/order-assistant/versions",
                       {"model": "demo/planner", "policy": {"input_masking": {"raw": ["email"]}}}, format="json")
    number = created.json()["number"]
    changed = api.patch(f"/api/v1/agents/order-assistant/versions/{number}", {"policy": {}}, format="json")
    assert changed.status_code == 200, changed.content
    rows = list(ConfigChange.objects.filter(tenant=world.tenant, action="agent_version.raw_input").order_by("created_at", "id"))
    assert [(r.details["before"], r.details["raw"]) for r in rows] == [([], ["email"]), (["email"], [])]
