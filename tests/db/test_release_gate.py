"""Issue #16 item 5: the release gate. A version other than the stable one gets release weight only after a passed
replay batch on the gate's evaluation set; every decision is audited (a refusal's row survives the refusal); the API,
the admin and the rollback guard ("checks" on live traffic) go through the same service and checks."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts import services as tenant_services
from agents import services as agent_services
from agents.models import AgentVersion, Run, RunStatus, Session
from audit.models import ConfigChange
from core.errors import NotFound
from marketplace import services
from marketplace.models import ReleaseGate, ReleaseWeight
from releases import services as releases
from releases.models import EvaluationSet, EvaluationSetRun, ReplayBatch
from tenants.models import Role
from tenants.scoping import Actor, actor_for_user
from tests.factories import World, make_user, make_world
from tests.support.clients import bearer_client


def _v2(world: World) -> AgentVersion:
    return AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner",
                                       system_prompt="v2", tools=world.version.tools, policy=world.version.policy)


def _finish(world: World, version: AgentVersion, n: int, *, output: str = "Your order ships today.", cost: float = 0.0,
            step: int = 2) -> list[Run]:
    runs = []
    for _ in range(n):
        session = Session.objects.create(tenant=world.tenant, agent=world.agent)
        runs.append(Run.objects.create(tenant=world.tenant, agent=world.agent, version=version, session=session, input="x",
                                       status=RunStatus.FINISHED, terminal_reason="final_answer", finished_at=timezone.now(),
                                       usage={"cost": cost}, output=output, step=step))
    return runs


def _set(world: World, name: str = "golden") -> EvaluationSet:
    runs = _finish(world, world.version, 3)
    evaluation_set = EvaluationSet.objects.create(tenant=world.tenant, name=name, agent=world.agent, filters={"picked": 3})
    EvaluationSetRun.objects.bulk_create([EvaluationSetRun(tenant=world.tenant, evaluation_set=evaluation_set, run=r, position=i)
                                          for i, r in enumerate(runs)])
    return evaluation_set


def _batch(world: World, evaluation_set: EvaluationSet, version: AgentVersion, pass_rate: float | None, *,
           mode: str = "recorded", status: str = "finished", checks: list[dict[str, Any]] | None = None) -> ReplayBatch:
    """A replay batch as the engine leaves it once finished (the engine's own tests replay; here only its verdict counts)."""
    return ReplayBatch.objects.create(tenant=world.tenant, evaluation_set=evaluation_set, candidate=version, model_mode=mode,
                                      status=status, total=3, done=3, pass_rate=pass_rate, checks=checks or [],
                                      cost_spent=Decimal(0), finished_at=timezone.now() if status == "finished" else None)


def _gate(world: World, evaluation_set: EvaluationSet, rate: float = 0.9, mode: str = "recorded",
          checks: list[dict[str, Any]] | None = None) -> ReleaseGate:
    gate = services.set_release_gate(agent=world.agent, evaluation_set=evaluation_set, min_pass_rate=rate, model_mode=mode,
                                     actor=actor_for_user(world.operator), **({"checks": checks} if checks else {}))
    assert gate is not None
    return gate


def _weights(world: World) -> dict[int, int]:
    return dict(ReleaseWeight.objects.filter(agent=world.agent).values_list("version__number", "weight"))


def _api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


@pytest.mark.django_db
def test_the_gate_refuses_weight_until_the_latest_batch_passes_and_audits_every_decision() -> None:
    world = make_world()
    v2 = _v2(world)
    golden = _set(world)
    _gate(world, golden, rate=0.9)
    assert ConfigChange.objects.filter(action="release.gate_set").count() == 1
    actor = actor_for_user(world.operator)

    # no replay yet: refused, naming the version, the set and what is needed
    with pytest.raises(services.GateRefused) as refused:
        services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor)
    message = str(refused.value)
    assert "v2" in message and "'golden'" in message and "at least 0.9" in message and "has none yet" in message
    assert refused.value.status == 409 and refused.value.field == "weights"
    row = ConfigChange.objects.get(action="release.gate_refused")
    assert row.details["version"] == 2 and row.details["batch"] is None and row.details["allowed"] is False
    assert _weights(world) == {}

    # a failed batch, a passing one in the wrong mode, an unfinished one: still refused, naming the batch's pass rate
    failed = _batch(world, golden, v2, 0.5)
    _batch(world, golden, v2, 1.0, mode="live")
    _batch(world, golden, v2, None, status="running")
    with pytest.raises(services.GateRefused, match=f"replay batch {failed.pk}\\) had pass rate 0.5"):
        services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor)

    # the stable version needs no replay; a weight of 0 is no release
    services.set_release_weights(agent=world.agent, weights={1: 100, 2: 0}, actor=actor)
    assert _weights(world) == {1: 100, 2: 0}

    # once the latest finished batch passes, the weight goes through, audited with the batch
    passed = _batch(world, golden, v2, 0.95)
    services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor)
    assert _weights(world) == {1: 90, 2: 10}
    allowed = ConfigChange.objects.get(action="release.gate_allowed", details__weight=10)
    assert allowed.details["batch"] == passed.pk and allowed.details["pass_rate"] == 0.95
    assert allowed.actor == world.operator

    # and a newer failing batch closes the gate again (the latest counts)
    _batch(world, golden, v2, 0.2)
    with pytest.raises(services.GateRefused):
        services.set_release_weights(agent=world.agent, weights={1: 80, 2: 20}, actor=actor)
    assert ConfigChange.objects.filter(action="release.gate_refused").count() == 3


@pytest.mark.django_db
def test_the_gate_service_validates_and_is_tenant_bound() -> None:
    world, other = make_world(), make_world()
    golden, theirs = _set(world), _set(other, "theirs")
    actor = actor_for_user(world.operator)
    with pytest.raises(services.MarketplaceError, match="min_pass_rate") as bad:
        services.set_release_gate(agent=world.agent, evaluation_set=golden, min_pass_rate=1.5, actor=actor)
    assert bad.value.field == "min_pass_rate"
    with pytest.raises(services.MarketplaceError) as bad:
        services.set_release_gate(agent=world.agent, evaluation_set=golden, model_mode="dream", actor=actor)
    assert bad.value.field == "model_mode"
    with pytest.raises(services.MarketplaceError) as bad:
        services.set_release_gate(agent=world.agent, evaluation_set=theirs, actor=actor)
    assert bad.value.field == "evaluation_set"
    with pytest.raises(NotFound):  # another tenant's operator: not theirs to gate, not even to know of
        services.set_release_gate(agent=world.agent, evaluation_set=golden, actor=actor_for_user(other.operator))
    _gate(world, golden)
    assert services.set_release_gate(agent=world.agent, evaluation_set=None, actor=actor) is None
    assert not ReleaseGate.objects.exists()
    assert ConfigChange.objects.get(action="release.gate_removed").details["previous"]["evaluation_set"] == "golden"


@pytest.mark.django_db(transaction=True)
def test_the_api_sets_the_gate_on_the_release_endpoint_and_a_refusal_is_a_409_whose_audit_row_is_kept() -> None:
    world, other = make_world(), make_world()
    v2 = _v2(world)
    golden, theirs = _set(world), _set(other, "theirs")
    url = f"/api/v1/releases/{world.agent.slug}"
    api = _api(world)

    bad = api.put(url, {"gate": {"evaluation_set": golden.pk, "min_pass_rate": 2}}, format="json")
    assert bad.status_code == 400 and "min_pass_rate" in bad.json()["gate"]
    foreign = api.put(url, {"gate": {"evaluation_set": theirs.pk, "min_pass_rate": 0.9}}, format="json")
    assert foreign.status_code == 400 and "evaluation_set" in foreign.json()["gate"]
    assert api.put(url, {}, format="json").status_code == 400

    response = api.put(url, {"gate": {"evaluation_set": golden.pk, "min_pass_rate": 0.9}}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["gate"]["evaluation_set"] == golden.pk and response.json()["gate"]["model_mode"] == "recorded"
    assert _api(world).get(url).json()["gate"]["evaluation_set_name"] == "golden"

    refused = api.put(url, {"weights": {"1": 90, "2": 10}}, format="json")
    assert refused.status_code == 409, refused.content
    body = refused.content.decode()
    assert "v2" in body and "golden" in body and "weights" in refused.json()
    assert refused.json()["error"]["code"] == "release_gate" and refused.json()["error"]["field"] == "weights"
    # the refusal is not saved, but its audit row is (committed on its own)
    assert ConfigChange.objects.filter(action="release.gate_refused", tenant=world.tenant).count() == 1
    assert _weights(world) == {}

    _batch(world, golden, v2, 1.0)
    assert api.put(url, {"weights": {"1": 90, "2": 10}}, format="json").status_code == 200
    assert ConfigChange.objects.filter(action="release.gate_allowed", tenant=world.tenant).count() == 1

    # another tenant cannot see or gate this agent (its own agent has the same slug: give this one its own)
    world.agent.slug = "only-in-a"
    world.agent.save(update_fields=["slug"])
    assert _api(other).put("/api/v1/releases/only-in-a", {"gate": None}, format="json").status_code == 404
    assert ReleaseGate.objects.filter(agent=world.agent).exists()
    assert api.put("/api/v1/releases/only-in-a", {"gate": None}, format="json").json()["gate"] is None


@pytest.mark.django_db
def test_the_admin_sets_gates_through_the_service_and_a_foreign_gate_is_a_404() -> None:
    world, other = make_world(), make_world()
    golden = _set(world)
    _set(other, "theirs")
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.operator)
    page = client.get("/admin/marketplace/releasegate/add/")
    assert page.status_code == 200
    choices = [str(c[0]) for c in page.context["adminform"].form.fields["evaluation_set"].choices if c[0]]
    assert choices == [str(golden.pk)]  # only this tenant's sets are offered
    data = {"agent": world.agent.pk, "evaluation_set": golden.pk, "min_pass_rate": "1.5", "model_mode": "recorded",
            "enabled": "on", "csrfmiddlewaretoken": page.context["csrf_token"]}
    again = client.post("/admin/marketplace/releasegate/add/", data)
    assert again.status_code == 200 and "fraction from 0 to 1" in again.content.decode()
    data["min_pass_rate"] = "0.8"
    assert client.post("/admin/marketplace/releasegate/add/", data).status_code == 302
    gate = ReleaseGate.objects.get(agent=world.agent)
    assert gate.min_pass_rate == 0.8 and gate.updated_by == world.operator
    assert ConfigChange.objects.filter(action="release.gate_set", actor=world.operator).exists()

    outsider = Client()
    outsider.force_login(other.operator)
    assert outsider.get(f"/admin/marketplace/releasegate/{gate.pk}/change/").status_code in (302, 404)
    assert outsider.post(f"/admin/marketplace/releasegate/{gate.pk}/delete/", {"post": "yes"}).status_code in (302, 404)
    assert ReleaseGate.objects.filter(pk=gate.pk).exists()


@pytest.mark.django_db
def test_the_agent_pages_weights_inline_shows_the_gates_refusal_and_keeps_its_audit_row() -> None:
    world = make_world()
    v2 = _v2(world)
    _gate(world, _set(world))
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.operator)
    url = f"/admin/agents/agent/{world.agent.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    data: dict[str, Any] = {"csrfmiddlewaretoken": page.context["csrf_token"]}
    form = page.context["adminform"].form
    for name in form.fields:
        value = form[name].value()
        if value is not None:
            data[name] = json.dumps(value) if isinstance(value, dict | list) else value
    [inline] = page.context["inline_admin_formsets"]
    prefix = inline.formset.prefix
    data.update({f"{prefix}-TOTAL_FORMS": "2", f"{prefix}-INITIAL_FORMS": "0", f"{prefix}-MIN_NUM_FORMS": "0",
                 f"{prefix}-MAX_NUM_FORMS": "1000", f"{prefix}-0-version": world.version.pk, f"{prefix}-0-weight": "90",
                 f"{prefix}-1-version": v2.pk, f"{prefix}-1-weight": "10"})
    response = client.post(url, data)
    assert response.status_code == 200, response.status_code
    html = response.content.decode()
    assert "release gate needs" in html and "golden" in html
    assert _weights(world) == {}
    assert ConfigChange.objects.filter(action="release.gate_refused", actor=world.operator).count() == 1


@pytest.mark.django_db
def test_the_checks_guard_rolls_back_a_version_failing_the_gates_checks_on_live_traffic() -> None:
    world = make_world()
    v2 = _v2(world)
    golden = _set(world)
    checks = [{"check": "same_tools"}, {"check": "answer_not_contains", "text": "sorry"}, {"check": "cost_at_most", "times": 2}]
    _gate(world, golden, checks=checks)
    _batch(world, golden, v2, 1.0, checks=checks)
    actor = actor_for_user(world.operator)
    services.set_release_weights(agent=world.agent, weights={1: 80, 2: 20}, actor=actor)
    services.set_release_guard(agent=world.agent, metric="checks", threshold=0.2, window=20, min_runs=10, actor=actor)
    _finish(world, world.version, 10, cost=0.01)  # the stable version's recent average: cost_at_most 2× is 0.02

    _finish(world, v2, 9, cost=0.01)
    _finish(world, v2, 1, output="I'm sorry, I cannot find it.", cost=0.01)
    assert services.check_release_guards() == []  # 1 in 10 fails: under 0.2
    guard = world.agent.release_guards.get()
    assert guard.last_value == pytest.approx(0.1)

    _finish(world, v2, 2, cost=0.05)  # too dear: more than twice the stable version's average
    [trip] = services.check_release_guards()
    assert trip.version == 2 and trip.metric == "checks" and trip.value == pytest.approx(3 / 12)
    assert _weights(world) == {1: 100, 2: 0}
    change = ConfigChange.objects.get(action="release.rolled_back")
    assert change.details["automatic"] is True and change.details["metric"] == "checks"


@pytest.mark.django_db
def test_the_gate_follows_real_replays_a_faithful_copy_passes_and_a_tighter_version_is_blocked() -> None:
    """End to end with the engine: real demo runs, a set of them, recorded-mode replays of two candidates."""
    world = make_world()
    for text in ("Where is my order O202411280001?", "What is in order O202411280002?"):
        run = agent_services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text=text)
        agent_services.execute_run(str(run.pk))
    actor = actor_for_user(world.operator)
    golden = releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="golden", agent=world.agent,
                                            filters={"limit": 10})
    same = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model=world.version.model,
                                       system_prompt=world.version.system_prompt, tools=world.version.tools,
                                       policy=world.version.policy)
    lean = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=3, model=world.version.model,
                                       system_prompt=world.version.system_prompt, tools=world.version.tools,
                                       policy={"limits": {"max_recursion": 1}})  # stops before the tools answer
    _gate(world, golden, rate=1.0)
    for candidate in (same, lean):
        batch = releases.start_replay(tenant=world.tenant, actor=actor, evaluation_set=golden, candidate=candidate,
                                      checks=[{"check": "no_diff"}], concurrency=1)
        releases.run_shard(batch.pk, 0, 1)
        batch.refresh_from_db()
        assert batch.status == "finished", batch.error
    assert ReplayBatch.objects.get(candidate=same).pass_rate == 1.0
    failed = ReplayBatch.objects.get(candidate=lean)
    assert failed.pass_rate is not None and failed.pass_rate < 1.0

    services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor)
    assert _weights(world) == {1: 90, 2: 10}
    with pytest.raises(services.GateRefused, match=f"v3 .*replay batch {failed.pk}"):
        services.set_release_weights(agent=world.agent, weights={1: 80, 2: 10, 3: 10}, actor=actor)
    assert _weights(world) == {1: 90, 2: 10}
    assert [r.details["version"] for r in ConfigChange.objects.filter(action="release.gate_refused")] == [3]


# -- issue #49 hole 5: the gate owns its checks, and every way of making a version current goes through it ----------


def _agent_form(client: Client, world: World) -> tuple[str, dict[str, Any]]:
    """The agent's admin change form as the browser would post it back (its weights inline left empty)."""
    url = f"/admin/agents/agent/{world.agent.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    data: dict[str, Any] = {"csrfmiddlewaretoken": page.context["csrf_token"]}
    form = page.context["adminform"].form
    for name in form.fields:
        value = form[name].value()
        if value is not None:
            data[name] = value
    [inline] = page.context["inline_admin_formsets"]
    prefix = inline.formset.prefix
    data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0", f"{prefix}-MIN_NUM_FORMS": "0",
                 f"{prefix}-MAX_NUM_FORMS": "1000"})
    return url, data


@pytest.mark.django_db
def test_a_batch_counts_only_if_it_ran_at_least_the_gates_checks() -> None:
    world = make_world()
    v2 = _v2(world)
    golden = _set(world)
    _gate(world, golden, rate=0.9)  # the default checks: same_tools, same_terminal_reason
    actor = actor_for_user(world.operator)

    # a replay whose one check cannot fail passes 100 %: it does not count, and the refusal says why
    cannot_fail = _batch(world, golden, v2, 1.0, checks=[{"check": "answer_not_contains", "text": "zz"}])
    with pytest.raises(services.GateRefused) as refused:
        services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor)
    assert f"replay batch {cannot_fail.pk}) did not run" in str(refused.value) and "same_tools" in str(refused.value)
    assert ConfigChange.objects.get(action="release.gate_refused").details["checks"] == [
        {"check": "same_tools"}, {"check": "same_terminal_reason"}]
    assert _weights(world) == {}

    # a stricter batch counts (no_diff covers both), even when a weaker one finished after it
    strict = _batch(world, golden, v2, 0.95, checks=[{"check": "no_diff"}])
    _batch(world, golden, v2, 1.0, checks=[{"check": "answer_not_contains", "text": "zz"}])
    services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor)
    assert ConfigChange.objects.get(action="release.gate_allowed").details["batch"] == strict.pk

    # parameters: a text the gate's contains (not_contains) and a lower 'times' are stricter; a higher one is not
    gate = _gate(world, golden, checks=[{"check": "answer_not_contains", "text": "sorry"}, {"check": "cost_at_most", "times": 2}])
    assert gate.checks == [{"check": "answer_not_contains", "text": "sorry"}, {"check": "cost_at_most", "times": 2}]
    looser = _batch(world, golden, v2, 1.0, checks=[{"check": "answer_not_contains", "text": "sorr"},
                                                    {"check": "cost_at_most", "times": 3}])
    with pytest.raises(services.GateRefused, match=f"batch {looser.pk}\\) did not run .*cost_at_most"):
        services.set_release_weights(agent=world.agent, weights={1: 80, 2: 20}, actor=actor)
    _batch(world, golden, v2, 1.0, checks=[{"check": "answer_not_contains", "text": "sorr"}, {"check": "cost_at_most", "times": 1.5}])
    services.set_release_weights(agent=world.agent, weights={1: 80, 2: 20}, actor=actor)
    assert _weights(world) == {1: 80, 2: 20}


@pytest.mark.django_db
def test_a_replay_started_before_the_version_was_edited_does_not_count() -> None:
    world = make_world()
    v2 = _v2(world)
    golden = _set(world)
    _gate(world, golden)
    actor = actor_for_user(world.operator)
    _batch(world, golden, v2, 1.0)
    agent_services.update_version(actor=actor, version=v2, system_prompt="something else entirely")
    with pytest.raises(services.GateRefused, match="was started before v2 was last edited"):
        services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor)
    _batch(world, golden, v2, 1.0)  # replayed again, as it is now
    services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor)


@pytest.mark.django_db
def test_the_gates_checks_are_a_typed_document_shown_and_set_on_the_release_endpoint() -> None:
    world = make_world()
    golden = _set(world)
    url = f"/api/v1/releases/{world.agent.slug}"
    api = _api(world)
    bad = api.put(url, {"gate": {"evaluation_set": golden.pk, "min_pass_rate": 0.9,
                                 "checks": [{"check": "answer_contains"}, {"check": "same_tools", "times": 2}, {"check": "x"}]}},
                  format="json")
    assert bad.status_code == 400, bad.content
    problems = bad.json()["checks"]
    assert any(p.startswith("checks[0].text: answer_contains needs 'text'") for p in problems)
    assert any(p.startswith("checks[1].times: same_tools takes no 'times'") for p in problems)
    assert any(p.startswith("checks[2].check: must be one of") for p in problems)
    assert api.put(url, {"gate": {"evaluation_set": golden.pk, "min_pass_rate": 0.9, "checks": []}},
                   format="json").status_code == 400
    assert not ReleaseGate.objects.exists()

    ok = api.put(url, {"gate": {"evaluation_set": golden.pk, "min_pass_rate": 0.9}}, format="json")
    assert ok.status_code == 200 and ok.json()["gate"]["checks"] == [{"check": "same_tools"}, {"check": "same_terminal_reason"}]
    mine = [{"check": "no_diff"}, {"check": "answer_contains", "text": "ships"}]
    ok = api.put(url, {"gate": {"evaluation_set": golden.pk, "min_pass_rate": 0.9, "checks": mine}}, format="json")
    assert ok.status_code == 200 and api.get(url).json()["gate"]["checks"] == mine
    # set again without checks: kept
    assert api.put(url, {"gate": {"evaluation_set": golden.pk, "min_pass_rate": 1}}, format="json").json()["gate"]["checks"] == mine
    assert ConfigChange.objects.filter(action="release.gate_set").latest("id").details["gate"]["checks"] == mine


@pytest.mark.django_db(transaction=True)
def test_make_current_goes_through_the_gate_refused_until_replayed_and_a_rollback_is_allowed_and_audited() -> None:
    world = make_world()
    golden = _set(world)
    api = _api(world)
    versions = f"/api/v1/agents/{world.agent.slug}/versions"
    body = {"model": "demo/planner", "tools": world.version.tools}

    # without a gate, make_current is allowed and audited as the change it is
    made = api.post(versions, {**body, "make_current": True}, format="json")
    assert made.status_code == 201 and made.json()["current"] is True
    row = ConfigChange.objects.get(action="agent.current_set")
    assert (row.details["version"], row.details["previous"]) == (2, 1)
    v2 = AgentVersion.objects.get(agent=world.agent, number=2)

    _gate(world, golden)
    # with it, a new version cannot be made current: a 409 saying what is needed, nothing created, the refusal on record
    refused = api.post(versions, {**body, "make_current": True}, format="json")
    assert refused.status_code == 409, refused.content
    assert refused.json()["error"]["code"] == "release_gate" and refused.json()["error"]["field"] == "current_version"
    assert "needs a finished replay of v3" in refused.json()["error"]["message"]
    assert not AgentVersion.objects.filter(agent=world.agent, number=3).exists()
    world.agent.refresh_from_db()
    assert world.agent.current_version_id == v2.pk
    gate_row = ConfigChange.objects.get(action="release.gate_refused")
    assert gate_row.details["change"] == "current" and gate_row.details["version"] == 3

    # an existing version no replay passed: refused the same way, on the version's own PATCH
    assert api.post(versions, body, format="json").json()["number"] == 3
    v3 = AgentVersion.objects.get(agent=world.agent, number=3)
    refused = api.patch(f"{versions}/3", {"make_current": True}, format="json")
    assert refused.status_code == 409 and "v3" in refused.json()["error"]["message"]
    assert ConfigChange.objects.filter(action="release.gate_refused").count() == 2

    # once a replay running the gate's checks passed, it may: audited with its batch
    passed = _batch(world, golden, v3, 1.0)
    assert api.patch(f"{versions}/3", {"make_current": True}, format="json").json()["current"] is True
    allowed = ConfigChange.objects.get(action="release.gate_allowed")
    assert allowed.details["batch"] == passed.pk and allowed.details["rollback"] is False

    # back to v2, stable before and never replayed: allowed as an explicit rollback
    back = api.patch(f"{versions}/2", {"make_current": True}, format="json")
    assert back.status_code == 200 and back.json()["current"] is True
    rollback = ConfigChange.objects.filter(action="release.gate_allowed").latest("id")
    assert rollback.details["rollback"] is True and rollback.details["version"] == 2 and "rollback" in rollback.details["reason"]
    assert ConfigChange.objects.filter(action="agent.current_set").latest("id").details["previous"] == 3


@pytest.mark.django_db
def test_the_admins_agent_form_makes_a_version_current_through_the_gate_too() -> None:
    world = make_world()
    v2 = _v2(world)
    golden = _set(world)
    _gate(world, golden)
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.operator)

    url, data = _agent_form(client, world)
    response = client.post(url, {**data, "current_version": v2.pk})
    assert response.status_code == 200, response.status_code
    assert "release gate needs" in response.content.decode()
    world.agent.refresh_from_db()
    assert world.agent.current_version_id == world.version.pk
    assert ConfigChange.objects.filter(action="release.gate_refused", actor=world.operator).count() == 1
    # nor may the form leave the agent without a current version (its newest version would run, unreplayed)
    response = client.post(url, {**data, "current_version": ""})
    assert response.status_code == 200 and "keeps a current (stable) version" in response.content.decode()
    world.agent.refresh_from_db()
    assert world.agent.current_version_id == world.version.pk

    passed = _batch(world, golden, v2, 1.0)
    url, data = _agent_form(client, world)
    assert client.post(url, {**data, "current_version": v2.pk}).status_code == 302
    world.agent.refresh_from_db()
    assert world.agent.current_version_id == v2.pk
    assert ConfigChange.objects.get(action="release.gate_allowed", actor=world.operator).details["batch"] == passed.pk
    assert ConfigChange.objects.get(action="agent.current_set").details["version"] == 2


@pytest.mark.django_db
def test_deleting_the_current_version_is_a_change_of_the_current_version_through_the_gate() -> None:
    world = make_world()
    fresh = agent_services.create_version(actor=actor_for_user(world.operator), agent=world.agent, model="demo/planner")
    world.agent.current_version = fresh  # set up as the factory does (the service is tested above)
    world.agent.save(update_fields=["current_version"])
    _gate(world, _set(world))
    # without a current version the agent's newest version would run, replayed or not: refused, on record
    response = _api(world).delete(f"/api/v1/agents/{world.agent.slug}/versions/{fresh.number}")
    assert response.status_code == 409 and response.json()["error"]["code"] == "release_gate", response.content
    assert AgentVersion.objects.filter(pk=fresh.pk).exists()
    assert ConfigChange.objects.get(action="release.gate_refused").details["version"] is None


@pytest.mark.django_db
def test_a_plugin_presets_first_version_is_made_current_through_the_same_service() -> None:
    world = make_world()
    owner = make_user(f"{world.tenant.slug}-owner", is_staff=True)
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    services.install_plugin(tenant=world.tenant, plugin_key="flight-desk", actor=actor_for_user(owner))
    agent = services.create_agent_from_preset(tenant=world.tenant, plugin_key="flight-desk", preset_slug="flight-assistant",
                                              actor=actor_for_user(world.operator))
    assert agent.current_version is not None and agent.current_version.number == 1
    row = ConfigChange.objects.get(action="agent.current_set", target_id=str(agent.pk))
    assert row.details["version"] == 1 and row.details["reason"] == "preset flight-desk/flight-assistant"
    assert row.actor == world.operator
