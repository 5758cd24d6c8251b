"""Gray release: sticky weighted assignment, the version recorded on the run, instant and automatic rollback."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.utils import timezone

from agents import services as agent_services
from agents.models import AgentVersion, Run, RunStatus, Session
from agents.services import start_run
from audit.models import ConfigChange
from core.errors import NotFound
from marketplace import services
from marketplace.access import tool_allowed_for
from marketplace.models import ReleaseWeight
from marketplace.release import assign, bucket, pick, weight_errors
from marketplace.tasks import check_release_guards_task
from tenants.scoping import actor_for_user
from tests.factories import World, make_world
from tools.models import Tool
from tools.services import set_tool_enabled

SESSIONS = [uuid.uuid5(uuid.NAMESPACE_URL, f"session-{i}") for i in range(2000)]


# --------------------------------------------------------------------------- pure assignment


def test_2000_sessions_at_90_10_land_within_2_percent_and_stick() -> None:
    weights = [("v1", 90), ("v2", 10)]
    first = [assign(weights, 42, s) for s in SESSIONS]
    share_v2 = first.count("v2") / len(SESSIONS)
    assert 0.08 <= share_v2 <= 0.12, share_v2
    # the same session always gets the same version
    assert [assign(weights, 42, s) for s in SESSIONS] == first
    # and buckets are spread evenly over 0..99
    buckets = [bucket(42, s) for s in SESSIONS]
    assert min(buckets) == 0 and max(buckets) == 99


def test_ramping_a_candidate_up_only_moves_sessions_to_it() -> None:
    at_10 = {s: assign([("v1", 90), ("v2", 10)], 7, s) for s in SESSIONS}
    at_30 = {s: assign([("v1", 70), ("v2", 30)], 7, s) for s in SESSIONS}
    assert all(at_30[s] == "v2" for s, v in at_10.items() if v == "v2")


def test_the_tenant_is_part_of_the_hash() -> None:
    assert [bucket(1, s) for s in SESSIONS[:50]] != [bucket(2, s) for s in SESSIONS[:50]]
    assert pick([("a", 0), ("b", 100)], 0) == "b"
    assert pick([("a", 50)], 60) is None


def test_weight_errors_are_readable() -> None:
    assert weight_errors({1: 90, 2: 5}, known_numbers=[1, 2], agent_slug="bot") == ["Weights must add up to 100; v1 90, v2 5 add up to 95."]
    assert weight_errors({1: 90, 7: 10}, known_numbers=[1, 2], agent_slug="bot") == [
        "v7 is not a version of agent 'bot'; its versions are v1, v2."]
    assert weight_errors({1: 101, 2: -1}, known_numbers=[1, 2], agent_slug="bot") == [
        "The weight of v1 must be a whole number from 0 to 100; got 101.",
        "The weight of v2 must be a whole number from 0 to 100; got -1."]
    assert weight_errors({}, known_numbers=[1], agent_slug="bot") == []


# --------------------------------------------------------------------------- with the database


def second_version(world: World) -> AgentVersion:
    return AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner",
                                       system_prompt="v2", tools=world.version.tools, policy=world.version.policy)


def run_in(world: World, session_id: Any) -> Run:
    session, _ = Session.objects.get_or_create(id=session_id, defaults={"tenant": world.tenant, "agent": world.agent})
    run = start_run(actor=actor_for_user(world.operator), agent=world.agent, text="where is O202411280001?", session=session)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FINISHED, terminal_reason="final_answer", finished_at=timezone.now())
    return run


@pytest.mark.django_db
def test_start_run_records_the_released_version_sticky_per_session() -> None:
    world = make_world()
    v2 = second_version(world)
    services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor_for_user(world.operator))

    sessions = SESSIONS[:400]
    runs = [run_in(world, s) for s in sessions]

    expected = {s: assign([(world.version.pk, 90), (v2.pk, 10)], world.tenant.pk, s) for s in sessions}
    assert all(run.version_id == expected[run.session_id] for run in runs)
    share_v2 = sum(r.version_id == v2.pk for r in runs) / len(runs)
    assert 0.06 <= share_v2 <= 0.14, share_v2
    # a conversation never flips: the next runs of each session get the same version
    for run in runs[:60]:
        assert run_in(world, run.session_id).version_id == run.version_id
    # a new session (no id given) is assigned by the id it is created with
    fresh = start_run(actor=actor_for_user(world.operator), agent=world.agent, text="hi")
    assert fresh.version_id == assign([(world.version.pk, 90), (v2.pk, 10)], world.tenant.pk, fresh.session_id)


@pytest.mark.django_db
def test_weights_are_validated_and_audited() -> None:
    world, other = make_world(), make_world()
    second_version(world)

    with pytest.raises(services.InvalidWeights, match="add up to 95"):
        services.set_release_weights(agent=world.agent, weights={1: 90, 2: 5}, actor=actor_for_user(world.operator))
    with pytest.raises(services.InvalidWeights, match="is not a version of agent"):
        services.set_release_weights(agent=world.agent, weights={other.version: 100}, actor=actor_for_user(world.operator))
    with pytest.raises(services.InvalidWeights, match="v9 is not a version"):
        services.set_release_weights(agent=world.agent, weights={"v1": 91, "v9": 9}, actor=actor_for_user(world.operator))
    with pytest.raises(NotFound):  # another tenant's agent: not found, as everywhere
        services.set_release_weights(agent=world.agent, weights={1: 100}, actor=actor_for_user(other.operator))
    assert not ReleaseWeight.objects.filter(agent=world.agent).exists()

    services.set_release_weights(agent=world.agent, weights={"v1": 80, "v2": 20}, actor=actor_for_user(world.operator))

    change = ConfigChange.objects.get(action="release.weights_set", actor=world.operator)
    assert change.details == {"weights": {"v1": 80, "v2": 20}, "previous": {}}


@pytest.mark.django_db
def test_rollback_takes_effect_on_the_next_run() -> None:
    world = make_world()
    v2 = second_version(world)
    services.set_release_weights(agent=world.agent, weights={1: 50, 2: 50}, actor=actor_for_user(world.operator))
    on_v2 = [s for s in SESSIONS[:40] if run_in(world, s).version_id == v2.pk]
    assert on_v2

    # when an operator rolls v2 back
    services.rollback_version(agent=world.agent, version=v2, actor=actor_for_user(world.operator), reason="bad answers")

    # then the very next run of every v2 session gets the stable v1; no deploy, no restart
    assert {run_in(world, s).version_id for s in on_v2} == {world.version.pk}
    weights = dict(ReleaseWeight.objects.filter(agent=world.agent).values_list("version__number", "weight"))
    assert weights == {1: 100, 2: 0}
    change = ConfigChange.objects.get(action="release.rolled_back")
    assert change.actor == world.operator
    assert change.details["reason"] == "bad answers" and change.details["moved"] == 50 and not change.details["automatic"]
    with pytest.raises(services.MarketplaceError, match="stable version"):
        services.rollback_version(agent=world.agent, version=world.version, actor=actor_for_user(world.operator))


def finish(world: World, version: AgentVersion, reasons: list[str], cost: float = 0.0) -> None:
    for reason in reasons:
        session = Session.objects.create(tenant=world.tenant, agent=world.agent)
        Run.objects.create(tenant=world.tenant, agent=world.agent, version=version, session=session, input="x",
                           status=RunStatus.FINISHED, terminal_reason=reason, finished_at=timezone.now(), usage={"cost": cost})


@pytest.mark.django_db
def test_an_error_spike_trips_the_guard_and_the_weight_returns_to_stable() -> None:
    world = make_world()
    v2 = second_version(world)
    services.set_release_weights(agent=world.agent, weights={1: 90, 2: 10}, actor=actor_for_user(world.operator))
    services.set_release_guard(agent=world.agent, metric="error_rate", threshold=0.2, window=20, min_runs=10,
                               actor=actor_for_user(world.operator))

    # healthy so far, and too few runs to judge
    finish(world, v2, ["final_answer"] * 6 + ["error"])
    finish(world, world.version, ["error"] * 10)  # the stable version's errors are not the candidate's
    assert services.check_release_guards() == []

    # when v2 hits an error spike
    finish(world, v2, ["error"] * 5)
    assert check_release_guards_task() == 1  # the periodic task, called synchronously

    # then its weight is back on the stable version, with an audit row saying why
    weights = dict(ReleaseWeight.objects.filter(agent=world.agent).values_list("version__number", "weight"))
    assert weights == {1: 100, 2: 0}
    change = ConfigChange.objects.get(action="release.rolled_back")
    assert change.actor is None and change.details["automatic"] is True
    assert change.details["metric"] == "error_rate" and change.details["value"] == pytest.approx(6 / 12)
    assert "Error rate" in change.details["reason"] and "threshold 0.2" in change.details["reason"]
    assert run_in(world, SESSIONS[0]).version_id == world.version.pk
    # and the check is idempotent
    assert services.check_release_guards() == []


@pytest.mark.django_db
def test_a_cost_guard_looks_at_the_average_cost_per_run() -> None:
    world = make_world()
    v2 = second_version(world)
    services.set_release_weights(agent=world.agent, weights={1: 0, 2: 100}, actor=actor_for_user(world.operator))
    services.set_release_guard(agent=world.agent, metric="cost_per_run", threshold=0.05, window=10, min_runs=5,
                               actor=actor_for_user(world.operator))
    finish(world, v2, ["final_answer"] * 5, cost=0.04)
    assert services.check_release_guards() == []
    finish(world, v2, ["final_answer"] * 5, cost=0.09)
    [trip] = services.check_release_guards()
    assert trip.version == 2 and trip.value == pytest.approx(0.065)


@pytest.mark.django_db
def test_a_new_version_from_an_old_one_is_a_copy_audited() -> None:
    world = make_world()
    copy = agent_services.copy_version(version=world.version, actor=actor_for_user(world.operator))
    assert (copy.number, copy.tools, copy.model) == (2, world.version.tools, world.version.model)
    assert ConfigChange.objects.filter(action="agent_version.created", actor=world.operator, target_id=str(copy.pk)).exists()


@pytest.mark.django_db
def test_tool_gray_release_and_kill_switch() -> None:
    world = make_world()
    tool = Tool.objects.get(tenant=world.tenant, name="query_order")
    assert tool_allowed_for(tool, world.tenant.pk, "any") == (True, "")

    services.set_tool_rollout(tool=tool, enabled_percent=10, actor=actor_for_user(world.operator))

    decisions = [tool_allowed_for(tool, world.tenant.pk, s)[0] for s in SESSIONS]
    assert 0.08 <= sum(decisions) / len(decisions) <= 0.12
    assert [tool_allowed_for(tool, world.tenant.pk, s)[0] for s in SESSIONS[:100]] == decisions[:100]
    refused = next(s for s, ok in zip(SESSIONS, decisions, strict=True) if not ok)
    assert "rolled out gradually" in tool_allowed_for(tool, world.tenant.pk, refused)[1]
    assert ConfigChange.objects.filter(action="tool.rollout_set", actor=world.operator).exists()

    # the kill switch wins at once, for every session
    set_tool_enabled(tool=tool, enabled=False, actor=actor_for_user(world.operator))
    allowed, reason = tool_allowed_for(tool, world.tenant.pk, SESSIONS[0])
    assert not allowed and "switched off" in reason
    assert not tool_allowed_for(tool, world.tenant.pk + 10_000, SESSIONS[0])[0]  # and never for another tenant
