"""Issue #49 item 8: what a run answers is stored masked, by the rule the trace and the streamed deltas use.

A model that writes a card number, an ``sk-proj-`` key, a password, a Bearer token and a JWT into its final answer:
the run's ``output``, the session's turn, the ``run.finished`` event and the deltas a client streamed all hold the
same masked text, and a viewer's key reads none of the secrets from the API.
"""

from __future__ import annotations

import json

import pytest

from accounts import services as tenant_services
from agents import model_clients, services
from agents.models import Agent, AgentVersion, Run, RunEvent, Turn
from audit.masking import mask_text
from audit.stream_masking import StreamMasker
from runtime.scripted import ScriptedModel, say
from tenants.models import Role
from tenants.scoping import Actor
from tests.factories import World, make_world
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db

CARD = "4111 1111 1111 1111"
KEY = "sk-proj-Zx81kQm3Lw0VbN7rT2yUa5sD"
PASSWORD = "Hunter2swordfish"
BEARER = "mF9xQ2vL7pK4tR8w"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjdXN0b21lci00MiJ9.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"
SECRETS = (CARD, "4111111111111111", KEY, PASSWORD, BEARER, JWT)
ANSWER = (f"Your card {CARD} is on file. Use the key {KEY} with password={PASSWORD}; the service expects "
          f"Authorization: Bearer {BEARER}. Your session token is {JWT}.")


def _raw(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def _answered(world: World, monkeypatch: pytest.MonkeyPatch, answer: str) -> Run:
    model = ScriptedModel([say(answer)])
    monkeypatch.setattr(model_clients, "model_client_for", lambda run: model)
    run = services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text="what do you have on file for me?")
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert run.status == "finished" and run.terminal_reason == "final_answer", run.error
    return run


def _streamed(text: str, piece: int = 3) -> str:
    """The deltas a client would have been sent for ``text`` streamed in pieces (agents/run_deltas.py)."""
    masker = StreamMasker()
    return "".join(masker.feed(text[i:i + piece]) for i in range(0, len(text), piece)) + masker.finish()


def test_a_final_answer_with_secrets_is_stored_and_served_masked_like_the_trace_and_deltas(
        monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    run = _answered(world, monkeypatch, ANSWER)
    _key, viewer = tenant_services.create_api_key(tenant=world.tenant, name="ro", owner=world.viewer, role=Role.VIEWER,
                                                  actor=None)
    api = bearer_client(viewer)

    body = api.get(f"/api/v1/runs/{run.pk}")
    assert body.status_code == 200
    assert _raw(json.dumps(body.json())) == [], "a viewer read a secret of the answer"
    assert _raw(run.output) == [] and run.output, "the stored output holds a secret"
    turn = Turn.objects.get(run=run)
    assert _raw(turn.assistant_message) == []
    session = api.get(f"/api/v1/sessions/{run.session_id}").json()
    assert _raw(json.dumps(session)) == []

    # one rule: the stored output, the turn, the trace's run.finished event and the streamed deltas agree exactly
    finished = RunEvent.objects.get(run=run, type="run.finished").payload["output"]
    assert run.output == turn.assistant_message == finished == _streamed(ANSWER) == mask_text(ANSWER)
    assert body.json()["output"] == run.output
    assert "**** **** **** 1111" in run.output and "sk-proj-****" in run.output and "Bearer ******" in run.output


def test_a_supervisor_stores_its_sub_agents_answer_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    desk = Agent.objects.create(tenant=world.tenant, slug="front-desk", name="Front desk")
    version = AgentVersion(tenant=world.tenant, agent=desk, number=1, model="demo/planner", tools=[], policy={
        "supervisor": {"sub_agents": [{"agent": "order-assistant", "description": "Orders"}], "fallback": "order-assistant"}})
    version.full_clean()
    version.save()
    desk.current_version = version
    desk.save(update_fields=["current_version"])
    model = ScriptedModel([say(ANSWER)])
    monkeypatch.setattr(model_clients, "model_client_for", lambda run: model)
    run = services.start_run(actor=Actor(api_key=world.key), agent=desk, text="what do you have on file for me?")
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert run.terminal_reason == "final_answer", run.error
    assert run.output == mask_text(ANSWER) and _raw(run.output) == []
    assert _raw(json.dumps(list(Turn.objects.filter(run=run).values_list("assistant_message", flat=True)))) == []


def test_masking_the_answer_is_idempotent_and_leaves_plain_answers_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = "Order O202411280001 ships today with SF Express; my token expired yesterday, so call 400 800 1234."
    run = _answered(make_world(), monkeypatch, plain)
    assert run.output == mask_text(plain) == mask_text(mask_text(plain))
    assert "O202411280001" in run.output and "my token expired" in run.output


def test_answers_stored_raw_before_are_masked_by_the_command_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from io import StringIO

    from django.core.management import call_command

    world = make_world()
    run = _answered(world, monkeypatch, "The key is on file.")
    Run.objects.filter(pk=run.pk).update(output=ANSWER)  # as a run finished before answers were masked holds it
    Turn.objects.filter(run=run).update(assistant_message=ANSWER)
    dry = StringIO()
    call_command("mask_stored_answers", "--dry-run", stdout=dry)
    assert "would mask 1" in dry.getvalue() and Run.objects.get(pk=run.pk).output == ANSWER

    out = StringIO()
    call_command("mask_stored_answers", stdout=out)
    assert "masked 1" in out.getvalue()
    assert Run.objects.get(pk=run.pk).output == Turn.objects.get(run=run).assistant_message == mask_text(ANSWER)
    again = StringIO()
    call_command("mask_stored_answers", stdout=again)
    assert "masked 0" in again.getvalue() and again.getvalue().count("masked 0") == 2


def test_a_failed_runs_error_is_stored_masked_as_its_event_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()

    def fails(request: object) -> None:
        raise RuntimeError(f"the provider answered 401: password={PASSWORD} was refused for {KEY}")

    model = ScriptedModel([fails, fails, fails, fails])
    monkeypatch.setattr(model_clients, "model_client_for", lambda run: model)
    run = services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text="hello")
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert run.terminal_reason == "error" and run.error
    assert _raw(run.error) == [] and _raw(json.dumps(bearer_client(world.raw_key).get(f"/api/v1/runs/{run.pk}").json())) == []
