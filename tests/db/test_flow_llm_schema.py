"""An llm node's ``output_schema``: checked at save like every schema a tenant writes, given to the model as the shape
to reply in, and the reply checked against it (a reply that does not match fails the node, saying where)."""

from __future__ import annotations

from typing import Any

import pytest

from agents import model_clients, services
from agents.models import Run
from flows.models import FlowNodeRun
from runtime.scripted import ScriptedModel, say
from tests.db.test_flow_runs import ORDER, drain, make_flow, start
from tests.factories import World

pytestmark = pytest.mark.django_db

VERDICT = {"type": "object", "properties": {"refund": {"type": "boolean"}, "reason": {"type": "string", "maxLength": 40}},
           "required": ["refund", "reason"], "additionalProperties": False}


def flow(schema: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": [
        {"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
        {"id": "verdict", "kind": "llm", "after": ["order"], "prompt": "Refund {nodes.order}?", "output_schema": schema},
    ], "output": "nodes.verdict"}


def run_with_reply(world: World, monkeypatch: pytest.MonkeyPatch, reply: str) -> tuple[Run, ScriptedModel]:
    model = ScriptedModel([], summarizer=lambda request: say(reply))  # an llm node's call is of the summarize class
    monkeypatch.setattr(model_clients, "model_client_for", lambda run: model)
    make_flow(world, flow(VERDICT))
    answer = start(world, {"flow": "desk", "input": {"order_id": ORDER}})
    assert answer.status_code == 202, answer.content
    run = Run.objects.get(pk=answer.json()["id"])
    services.execute_run(str(run.pk))
    drain(run)
    return Run.objects.get(pk=run.pk), model


def test_a_reply_that_matches_is_the_node_s_output_and_the_model_was_told_the_shape(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    run, model = run_with_reply(world, monkeypatch, '{"refund": true, "reason": "damaged in transit"}')
    assert run.terminal_reason == "final_answer", run.error
    assert FlowNodeRun.objects.get(run=run, node_id="verdict").output == {"refund": True, "reason": "damaged in transit"}
    [request] = model.summary_requests
    assert request.messages[0]["role"] == "system" and '"required": ["refund", "reason"]' in request.messages[0]["content"]


@pytest.mark.parametrize("reply, says", [
    ('{"refund": "yes", "reason": "x"}', "refund: 'yes' is not of type 'boolean'"),
    ('{"refund": true}', "the reply: 'reason' is a required property"),
    ('{"refund": true, "reason": "' + "long " * 20 + '"}', "reason: "),
    ("Sure! I think a refund is fair.", "is not the JSON the node's output_schema asks for"),
])
def test_a_reply_that_does_not_match_fails_the_node_saying_where(world: World, monkeypatch: pytest.MonkeyPatch,
                                                                 reply: str, says: str) -> None:
    run, _ = run_with_reply(world, monkeypatch, reply)
    node = FlowNodeRun.objects.get(run=run, node_id="verdict")
    assert node.status == "failed" and says in node.error, node.error
    assert run.terminal_reason == "error"


@pytest.mark.parametrize("schema, says", [
    ({"type": "nope"}, "nodes[1].output_schema.type: not a valid JSON Schema"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(a"}}},
     "nodes[1].output_schema.properties.a.pattern"),
    ({"$ref": "https://example.com/schema.json"}, "nodes[1].output_schema: $ref"),
])
def test_an_output_schema_that_cannot_check_a_reply_is_refused_at_save_with_its_path(world: World, schema: dict[str, Any],
                                                                                     says: str) -> None:
    from tests.db.test_flow_runs import client_for

    api = client_for(world.raw_key)
    assert api.post("/api/v1/flows", {"slug": "desk", "name": "desk"}, format="json").status_code == 201
    response = api.post("/api/v1/flows/desk/versions", {"model": "demo/planner", "definition": flow(schema)}, format="json")
    assert response.status_code == 400, response.content[:300]
    assert any(says in problem for problem in response.json()["definition"]), response.json()["definition"]


def test_what_the_failure_quotes_from_the_reply_is_masked(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    run, _ = run_with_reply(world, monkeypatch, '{"refund": "sk-abcdefghijklmnopqrstuvwxyz123456", "reason": "x"}')
    error = FlowNodeRun.objects.get(run=run, node_id="verdict").error
    assert "is not of type 'boolean'" in error and "sk-abcdefghijklmnopqrstuvwxyz123456" not in error, error


def test_the_deterministic_planner_answers_in_the_shape_asked_for(world: World) -> None:
    """Embedded mode (``demo/planner``): an llm node with an output_schema gets JSON of that shape, the summary in
    its strings, so a flow an operator tries out in ``make run`` finishes."""
    schema = {"type": "object", "required": ["refund", "reason", "tier", "score", "notes"], "additionalProperties": False,
              "properties": {"refund": {"type": "boolean"}, "reason": {"type": "string", "maxLength": 30},
                             "tier": {"enum": ["gold", "silver"]}, "score": {"type": "integer", "minimum": 1},
                             "notes": {"type": "array", "items": {"type": "string"}}, "extra": {"type": "string"}}}
    make_flow(world, flow(schema))
    answer = start(world, {"flow": "desk", "input": {"order_id": ORDER}})
    run = Run.objects.get(pk=answer.json()["id"])
    services.execute_run(str(run.pk))
    drain(run)
    run.refresh_from_db()
    assert run.terminal_reason == "final_answer", run.error
    output = FlowNodeRun.objects.get(run=run, node_id="verdict").output
    assert output["refund"] is False and output["tier"] == "gold" and output["score"] == 1 and output["notes"] == []
    assert 0 < len(output["reason"]) <= 30 and set(output) == {"refund", "reason", "tier", "score", "notes"}


def test_a_condition_or_prompt_that_fails_to_evaluate_fails_its_node_saying_so(world: World, caplog: Any) -> None:
    """A type error in an expression (``abs`` of a text) is the tenant's, not the console's: the node fails with
    JMESPath's message, not as an internal error logged with a traceback."""
    make_flow(world, {"nodes": [
        {"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
        {"id": "route", "kind": "switch", "after": ["order"], "on_error": "continue",
         "cases": [{"when": "abs(input.order_id) > `1`", "goto": ["say"]}], "default": []},
        {"id": "say", "kind": "llm", "after": ["route"], "prompt": "Total {abs(input.order_id)}"},
    ]})
    run = Run.objects.get(pk=start(world, {"flow": "desk", "input": {"order_id": ORDER}}).json()["id"])
    services.execute_run(str(run.pk))
    drain(run)
    route = FlowNodeRun.objects.get(run=run, node_id="route")
    assert route.status == "failed" and route.error.startswith("a case's condition could not be evaluated: "), route.error
    assert "abs()" in route.error and "internal error" not in route.error
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    say = FlowNodeRun.objects.get(run=run, node_id="say")  # the switch's failure continued: the prompt is next, and fails too
    assert say.status == "failed" and say.error.startswith("the prompt could not be rendered: In function abs()"), say.error
    run.refresh_from_db()
    assert run.terminal_reason == "error" and run.error.startswith("node say failed: the prompt could not be rendered"), run.error


def test_a_prompt_that_fails_to_render_fails_its_node_saying_so(world: World) -> None:
    make_flow(world, {"nodes": [
        {"id": "order", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}},
        {"id": "say", "kind": "llm", "after": ["order"], "prompt": "Total {abs(input.order_id)}"},
    ]})
    run = Run.objects.get(pk=start(world, {"flow": "desk", "input": {"order_id": ORDER}}).json()["id"])
    services.execute_run(str(run.pk))
    drain(run)
    say = FlowNodeRun.objects.get(run=run, node_id="say")
    assert say.status == "failed" and say.error.startswith("the prompt could not be rendered: "), say.error
