"""What a sweep of every API endpoint with a second tenant's key and hostile bodies found (2026-12-06), each pinned:
a run's cancellation reaching another tenant's run, and requests that answered 500 or burned CPU unbounded."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from agents import services
from agents.models import Run, RunStatus
from tenants.scoping import actor_for_api_key
from tests.factories import World, make_world
from tests.support.clients import bearer_client

pytestmark = pytest.mark.django_db


def api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def raw_post(client: APIClient, path: str, body: str) -> Any:
    """A body sent as it is written (``1e400``, lone surrogates: what ``json.dumps`` would not write)."""
    return client.generic("POST", path, body.encode("utf-8", "surrogatepass"), content_type="application/json")


# -- a run's facts cannot name another tenant's run ---------------------------------------------------------


def test_a_client_cannot_set_the_fact_that_links_a_supervisor_to_its_child_and_cancel_another_tenant_s_run(
        world: World) -> None:
    victim = make_world()
    theirs = services.start_run(actor=actor_for_api_key(victim.key), agent=victim.agent, text="order O202411280001?")
    client = api(world)
    created = client.post("/api/v1/runs", {"agent": "order-assistant", "input": "hello",
                                           "facts": {"awaiting_child": str(theirs.pk), "parent_run": str(theirs.pk),
                                                     "parent_flow": "x", "flow_node": "y", "user_tier": "gold"}},
                          format="json")
    assert created.status_code == 202, created.content
    mine = Run.objects.get(pk=created.json()["id"])
    assert mine.facts == {"user_tier": "gold"}, "the console's own keys are dropped, the client's kept"
    assert client.post(f"/api/v1/runs/{mine.pk}/cancel").status_code == 202
    theirs.refresh_from_db()
    assert theirs.status == RunStatus.QUEUED and theirs.terminal_reason == "", "another tenant's run was cancelled"


def test_a_stored_fact_naming_another_tenant_s_run_reaches_neither_cancel_nor_resume(world: World) -> None:
    """Rows written before the keys were reserved: the lookups are scoped to the run's own tenant too."""
    victim = make_world()
    theirs = services.start_run(actor=actor_for_api_key(victim.key), agent=victim.agent, text="order O202411280001?")
    actor = actor_for_api_key(world.key)
    mine = services.start_run(actor=actor, agent=world.agent, text="hello")
    Run.objects.filter(pk=mine.pk).update(status=RunStatus.WAITING, facts={"awaiting_child": str(theirs.pk)})
    assert services.resume_waiting_run(mine.pk) is True, "another tenant's unfinished run held this one waiting"
    Run.objects.filter(pk=mine.pk).update(status=RunStatus.WAITING)
    services.cancel_run(actor=actor, run=Run.objects.get(pk=mine.pk))
    theirs.refresh_from_db()
    assert theirs.status == RunStatus.QUEUED


# -- expressions nested past what the parser, the checks and the evaluator can recurse -------------------------

DEEP = {
    "parentheses": "(" * 600 + "input" + ")" * 600,
    "brackets": "[" * 600 + "input" + "]" * 600,
    "nots": "!" * 1990 + "input",
    "pipes": "input" + "|b" * 997,
}


@pytest.mark.parametrize("shape", sorted(DEEP))
@pytest.mark.parametrize("where", ["inputs", "prompt", "output", "when"])
def test_an_expression_nested_too_deep_is_refused_at_save_naming_its_path(world: World, shape: str, where: str) -> None:
    deep = DEEP[shape]
    node: dict[str, Any] = {"id": "a", "kind": "tool", "tool": "query_order", "inputs": {"order_id": "input.order_id"}}
    nodes = [node]
    if where == "inputs":
        node["inputs"] = {"order_id": deep}
    elif where == "prompt":
        nodes.append({"id": "s", "kind": "llm", "after": ["a"], "prompt": "Say {" + deep + "}"})
    elif where == "when":
        nodes += [{"id": "r", "kind": "switch", "after": ["a"], "cases": [{"when": deep, "goto": ["z"]}], "default": []},
                  {"id": "z", "kind": "llm", "prompt": "done"}]
    definition: dict[str, Any] = {"nodes": nodes, **({"output": deep} if where == "output" else {})}
    client = api(world)
    assert client.post("/api/v1/flows", {"slug": "deep", "name": "Deep"}, format="json").status_code == 201
    response = client.post("/api/v1/flows/deep/versions", {"model": "demo/planner", "definition": definition},
                           format="json")
    assert response.status_code == 400, response.content[:300]
    assert "nests deeper than 64 levels" in response.content.decode() or "at most 2000 characters" in response.content.decode()


def test_an_expression_of_ordinary_depth_still_saves_and_evaluates() -> None:
    from runtime import expressions

    nested = "(" * 30 + "input.a" + ")" * 30
    assert expressions.search(nested, {"input": {"a": 1}}) == 1
    assert expressions.search("input" + ".b" * 997, {"input": {}}) is None  # a field chain is one level
    assert expressions.search("input" + " | @" * 62, {"input": 3}) == 3
    with pytest.raises(expressions.TooDeep):
        expressions.search("input" + " | @" * 64, {"input": 3})


# -- numbers past a double and lone surrogates: refused by the parser, for every endpoint ---------------------

BAD_BODIES = {
    "a number past a double": ('{"agent": "order-assistant", "input": "hi", "facts": {"x": 1e400}}',
                               "beyond the largest a double holds"),
    "one nested in a list": ('{"agent": "order-assistant", "input": "hi", "facts": {"x": [1, -1e400]}}',
                             "beyond the largest a double holds"),
    "a lone surrogate in a value": ('{"agent": "order-assistant", "input": "hi", "facts": {"k": "\\ud800"}}',
                                    "lone UTF-16 surrogate"),
    "a lone low surrogate in a key": ('{"agent": "order-assistant", "input": "hi", "facts": {"\\uDC00": 1}}',
                                      "lone UTF-16 surrogate"),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
@pytest.mark.parametrize("path", ["/api/v1/runs", "/api/v1/tools", "/api/v1/tools/query_order/dry-run"])
def test_a_body_no_json_column_or_utf8_text_can_hold_is_a_400_saying_what(world: World, case: str, path: str) -> None:
    body, says = BAD_BODIES[case]
    before = Run.objects.count()
    response = raw_post(api(world), path, body)
    assert response.status_code == 400, response.content[:300]
    assert says in response.json()["detail"]
    assert Run.objects.count() == before


def test_a_well_formed_surrogate_pair_and_a_large_finite_number_still_pass(world: World) -> None:
    response = raw_post(api(world), "/api/v1/runs",
                        '{"agent": "order-assistant", "input": "hi \\ud83d\\ude00", "facts": {"x": 1.5e308, "y": "\\ud83d\\ude00"}}')
    assert response.status_code == 202, response.content
    run = Run.objects.get(pk=response.json()["id"])
    # (PostgreSQL's jsonb gives 1.5e308 back written out as an integer: the same number)
    assert run.input == "hi \U0001f600" and run.facts["y"] == "\U0001f600" and float(run.facts["x"]) == 1.5e308


# -- a preview of a change to a version runs used is checked as saving it would be ------------------------------


@pytest.mark.parametrize("used", [False, True], ids=["unused version", "version runs used"])
@pytest.mark.parametrize("policy", [True, "x", 1, [], {"limits": {"max_recursion": "lots"}},
                                    {"approvals": {"tools": {"query_order": "always"}}}])
def test_a_preview_of_a_policy_that_could_not_be_saved_is_a_400_naming_the_policy(world: World, used: bool,
                                                                                   policy: Any) -> None:
    if used:
        services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="hello")
    response = api(world).post("/api/v1/agents/order-assistant/versions/1/preview-impact", {"policy": policy},
                               format="json")
    assert response.status_code == 400, response.content[:300]
    assert "policy" in response.json()


# -- path segments and cursors that parse but do not fit ------------------------------------------------------


@pytest.mark.parametrize("ref", ["%C2%B2", "9" * 5000, "99999999999999999999", "%D9%A3"])
def test_a_tool_reference_that_is_no_id_or_name_here_is_a_404(world: World, ref: str) -> None:
    client = api(world)
    assert client.get(f"/api/v1/tools/{ref}").status_code == 404
    assert client.post(f"/api/v1/tools/{ref}/dry-run", {"arguments": {}}, format="json").status_code == 404


@pytest.mark.parametrize("path", ["agents", "flows", "tools", "evaluation-sets", "notification-channels", "runs",
                                  "audit/tool-calls", "approvals"])
@pytest.mark.parametrize("position", ["999999999999999999999999999999", "-99999999999999999999", "9" * 400])
def test_a_cursor_whose_position_does_not_fit_its_column_is_a_400_naming_cursor(world: World, path: str,
                                                                                position: str) -> None:
    import base64
    from urllib.parse import quote

    cursor = quote(base64.b64encode(f"p={position}".encode()).decode())
    response = api(world).get(f"/api/v1/{path}?cursor={cursor}")
    assert response.status_code == 400, response.content[:300]
    assert "cursor" in response.json()


# -- an evaluation set's filters: dates past the calendar and numbers past the column ---------------------------


@pytest.mark.parametrize("filters, field", [
    ({"created_after": "0001-01-01T00:00:00+05:00"}, "filters.created_after"),
    ({"created_before": "9999-12-31T23:59:59-05:00"}, "filters.created_before"),
    ({"created_after": "2020-01-01T00:00:00+99:00"}, "filters.created_after"),
    ({"created_after": "2020-13-45T00:00:00Z"}, "filters.created_after"),
    ({"versions": [100000000000000000000000]}, "filters.versions"),
    ({"versions": [0]}, "filters.versions"),
])
def test_an_evaluation_set_filter_out_of_range_is_a_400_naming_it(world: World, filters: dict[str, Any],
                                                                  field: str) -> None:
    response = api(world).post("/api/v1/evaluation-sets", {"name": "e", "agent": "order-assistant", "filters": filters},
                               format="json")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["field"] == field


def test_an_evaluation_set_filter_in_range_still_picks_runs(world: World) -> None:
    run = services.start_run(actor=actor_for_api_key(world.key), agent=world.agent, text="order O202411280001?")
    services.execute_run(str(run.pk))
    response = api(world).post("/api/v1/evaluation-sets", {
        "name": "e", "agent": "order-assistant",
        "filters": {"created_after": "2000-01-01T00:00:00+05:00", "created_before": "9999-12-30T00:00:00Z", "versions": [1]}},
        format="json")
    assert response.status_code == 201, response.content[:300]
    assert response.json()["runs"] == 1


# -- schemas of a size no person writes are refused before they are checked ------------------------------------


def _wide_schema(properties: int, patterns: bool) -> dict[str, Any]:
    def prop(i: int) -> dict[str, Any]:
        return {"type": "string", **({"pattern": f"^[a-z]{{{i}}}$"} if patterns else {})}

    return {"type": "object", "properties": {f"p{i}": prop(i) for i in range(properties)}}


@pytest.mark.parametrize("schema, says", [
    (_wide_schema(20_000, patterns=False), "more than 1000 objects"),
    (_wide_schema(300, patterns=True), "more than 200 distinct patterns"),
], ids=["objects", "patterns"])
@pytest.mark.parametrize("where", ["tool parameters", "tool output_schema", "flow input_schema"])
def test_a_schema_larger_than_a_person_writes_is_refused_at_once(world: World, schema: dict[str, Any], says: str,
                                                                  where: str) -> None:
    import time

    client = api(world)
    began = time.process_time()
    if where == "flow input_schema":
        assert client.post("/api/v1/flows", {"slug": "wide", "name": "Wide"}, format="json").status_code == 201
        definition = {"input_schema": schema, "nodes": [{"id": "a", "kind": "tool", "tool": "query_order",
                                                         "values": {"order_id": "O202411280001"}}]}
        response = client.post("/api/v1/flows/wide/versions", {"model": "demo/planner", "definition": definition},
                               format="json")
    else:
        field = "parameters" if where == "tool parameters" else "output_schema"
        body = {"name": "wide", "kind": "http", "description": "d", "config": {"url": "https://api.example.com/x"},
                "parameters": {"type": "object", "properties": {}}, field: schema}
        response = client.post("/api/v1/tools", body, format="json")
    spent = time.process_time() - began
    assert response.status_code == 400, response.content[:300]
    assert says in response.content.decode()
    print(f"{where}: refused in {spent:.2f} s of CPU")  # about 36 s before the bound, for the 2 MB schema


def test_a_schema_of_ordinary_size_with_patterns_still_saves(world: World) -> None:
    body = {"name": "ordinary", "kind": "http", "description": "d", "config": {"url": "https://api.example.com/x"},
            "parameters": _wide_schema(150, patterns=True)}
    response = api(world).post("/api/v1/tools", body, format="json")
    assert response.status_code == 201, response.content[:300]


def test_a_version_naming_more_tools_than_a_model_is_offered_is_refused_quickly(world: World) -> None:
    names = [f"t{i}" for i in range(50_000)]
    for path in ("/api/v1/agents/order-assistant/versions", "/api/v1/agents/order-assistant/versions/1/preview-impact"):
        response = api(world).post(path, {"model": "demo/planner", "tools": names}, format="json")
        assert response.status_code == 400 and "at most 128" in response.content.decode(), response.content[:300]
        assert len(response.content) < 5000  # the refusal does not list 50,000 names back


def test_a_flow_of_more_nodes_in_all_than_a_person_follows_is_refused_before_its_graphs_are_checked(world: World) -> None:
    def flow_of(maps: int, body: int) -> dict[str, Any]:
        nodes = [{"id": "items", "kind": "tool", "tool": "query_order", "values": {"order_id": "O202411280001"}}]
        nodes += [{"id": f"m{i}", "kind": "map", "after": ["items"], "over": "`[1, 2]`",
                   "body": {"nodes": [{"id": f"b{j}", "kind": "tool", "tool": "query_order",
                                       "values": {"order_id": "O202411280001"}} for j in range(body)]}}
                  for i in range(maps)]
        return {"nodes": nodes}

    client = api(world)
    assert client.post("/api/v1/flows", {"slug": "wide", "name": "Wide"}, format="json").status_code == 201
    refused = client.post("/api/v1/flows/wide/versions", {"model": "demo/planner", "definition": flow_of(100, 100)},
                          format="json")
    assert refused.status_code == 400
    assert "at most 400 nodes in all, the bodies of its maps counted; got 10101" in refused.content.decode()
    saved = client.post("/api/v1/flows/wide/versions", {"model": "demo/planner", "definition": flow_of(3, 10)},
                        format="json")
    assert saved.status_code == 201, saved.content[:500]
