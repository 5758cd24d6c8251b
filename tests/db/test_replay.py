"""Issue #16: evaluation sets and replays of recorded runs (releases/)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from agents import services
from agents.models import AgentVersion, Run, RunEvent, RunMessage, Session
from audit.models import ToolCallAudit
from core.errors import DomainError
from marketplace.builtin import order_desk
from releases import services as releases
from releases.models import EvaluationSet, ReplayBatch, ReplayRun
from tenants.scoping import Actor, actor_for_user
from tests.factories import make_world
from tools.services import install_python_tool

pytestmark = pytest.mark.django_db

QUESTIONS = ["Where is my order O202411280001?", "What is in order O202411280002?",
             "How much did orders O202411280001 and O202411280002 cost together?"]


@pytest.fixture
def world() -> Any:
    w = make_world()
    refund = install_python_tool(tenant=w.tenant, key="order_desk.refund_order", actor=None)
    w.version.tools = [*w.version.tools, refund.name]
    w.version.save(update_fields=["tools"])
    order_desk.REFUNDS.clear()
    for text in QUESTIONS:
        run = services.start_run(actor=Actor(api_key=w.key), agent=w.agent, text=text)
        services.execute_run(str(run.pk))
    return w


def _counts() -> tuple[int, int, int, int, int]:
    return (Run.objects.count(), RunEvent.objects.count(), RunMessage.objects.count(), ToolCallAudit.objects.count(),
            Session.objects.count())


def _replay(w: Any, candidate: AgentVersion, **options: Any) -> ReplayBatch:
    actor = actor_for_user(w.operator)
    name = options.pop("name", f"set-{candidate.number}-{ReplayBatch.objects.count()}")
    evaluation_set = releases.create_evaluation_set(tenant=w.tenant, actor=actor, name=name, agent=w.agent,
                                                    filters={"limit": 50})
    batch = releases.start_replay(tenant=w.tenant, actor=actor, evaluation_set=evaluation_set, candidate=candidate,
                                  concurrency=1, **options)
    releases.run_shard(batch.pk, 0, 1)
    batch.refresh_from_db()
    return batch


def test_a_recorded_replay_of_the_same_version_reproduces_every_run_exactly(world: Any) -> None:
    finished = Run.objects.filter(tenant=world.tenant, status="finished")
    assert finished.count() == 3 and all(r.terminal_reason == "final_answer" for r in finished)
    before = _counts()
    batch = _replay(world, world.version, checks=[{"check": "no_diff"}])
    assert batch.status == "finished" and batch.total == 3 and batch.done == 3
    assert batch.pass_rate == 1.0 and batch.passed_count == 3 and batch.failed_count == 0
    rows = list(ReplayRun.objects.filter(batch=batch))
    for row in rows:
        assert row.status == "replayed", row.error
        assert row.diff["changed"] == [], row.diff
        assert row.live_tool_calls == 0
    assert sum(1 for r in rows if r.diff["tools"]["recorded"]) >= 2, "the questions make the planner call tools"
    assert _counts() == before, "a recorded replay writes no run, event, message, audit row or session"
    assert order_desk.REFUNDS == {}


def test_a_prompt_and_tool_change_shows_in_the_diff(world: Any) -> None:
    lean = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner",
                                       system_prompt=world.version.system_prompt,
                                       tools=[t for t in world.version.tools if t != "query_logistics"])
    batch = _replay(world, lean, model_mode="live", cost_cap="1.00",
                    checks=[{"check": "same_tools"}, {"check": "answer_not_contains", "text": "SF Express"}])
    assert batch.status == "finished" and batch.done == 3
    rows = {r.source_run.input: r for r in ReplayRun.objects.filter(batch=batch).select_related("source_run")}
    where = rows[QUESTIONS[0]]
    assert where.passed is False and where.regression
    assert "tools" in where.diff["changed"] and "answer" in where.diff["changed"]
    assert all(c["tool"] != "query_logistics" for c in where.diff["tools"]["replayed"])
    assert any(line.startswith("-") and "SF Express" in line for line in where.diff["answer"]["diff"])
    assert batch.pass_rate is not None and batch.pass_rate < 1.0
    report = releases.batch_report(batch)
    assert report["results"][0]["regression"] is True, "regressions are listed first"
    tally: dict[str, int] = {}
    for row in rows.values():
        for key in row.diff["changed"]:
            tally[key] = tally.get(key, 0) + 1
    assert report["changed"] == tally and tally["tools"] >= 1, "how many runs changed in what, over the whole batch"


def test_a_write_tool_is_never_called_live_whatever_the_miss_policy(world: Any) -> None:
    refund_ask = "refund 30.00 for order O202411280001 because the glass cup broke"
    run = services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text=refund_ask)
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    recorded_refunds = sum(len(v) for book in order_desk.REFUNDS.values() for v in book.values())
    # the candidate's planner asks for another amount than the recording holds: a miss on a write tool
    candidate = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner",
                                            system_prompt=world.version.system_prompt, tools=world.version.tools)
    from releases import recording
    rec = recording.load([run.pk])[0]
    assert any(t["tool"] == "refund_order" for t in rec.tools), rec.tools
    for key in list(rec.outcomes):
        if key[0] == "refund_order":
            del rec.outcomes[key]
    from releases.replay import Candidate, replay
    for policy in ("stop", "live_read"):
        result = replay(Candidate.build(candidate, model_mode="recorded", miss_policy=policy), rec)
        assert result.terminal_reason == "replay_miss", result
        assert any("refund_order" in m for m in result.misses)
        assert result.live_tool_calls == 0
    assert sum(len(v) for book in order_desk.REFUNDS.values() for v in book.values()) == recorded_refunds


def test_a_read_miss_is_called_live_through_the_gateway_with_live_read(world: Any) -> None:
    run = Run.objects.filter(tenant=world.tenant, input=QUESTIONS[0]).get()
    from releases import recording
    from releases.replay import Candidate, replay
    rec = recording.load([run.pk])[0]
    rec.outcomes.clear()  # nothing recorded: every call misses
    stopped = replay(Candidate.build(world.version, model_mode="recorded", miss_policy="stop"), rec)
    assert stopped.terminal_reason == "replay_miss" and stopped.live_tool_calls == 0
    rec = recording.load([run.pk])[0]
    rec.outcomes.clear()
    live = replay(Candidate.build(world.version, model_mode="recorded", miss_policy="live_read", batch_id=7), rec)
    assert live.terminal_reason == "final_answer" and live.live_tool_calls == 1
    assert live.audit is not None and len(live.audit) == 1
    assert live.output == run.output


def test_bad_input_is_refused_naming_the_field(world: Any) -> None:
    actor = actor_for_user(world.operator)
    with pytest.raises(DomainError) as err:
        releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="x", agent=world.agent, filters={"colour": 1})
    assert err.value.field == "filters" and "colour" in err.value.message
    for bad, field in [({"tags": ["vip"]}, "filters.tags"), ({"status": "failed"}, "filters.status"),
                       ({"created_after": "yesterday"}, "filters.created_after"), ({"limit": 0}, "filters.limit"),
                       ({"versions": "1"}, "filters.versions")]:
        with pytest.raises(DomainError) as err:
            releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="x", agent=world.agent, filters=bad)
        assert err.value.field == field, (bad, err.value.message)
    finished = releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="finished", agent=world.agent,
                                              filters={"status": "finished", "versions": [1]})
    assert finished.members.count() == 3
    with pytest.raises(DomainError) as err:
        releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="x", agent=world.agent, run_ids=["nope"])
    assert err.value.field == "run_ids"
    s = releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="x", agent=world.agent)
    for bad, field in [({"checks": [{"check": "vibes"}]}, "checks"), ({"model_mode": "psychic"}, "model_mode"),
                       ({"model_mode": "live"}, "cost_cap"), ({"concurrency": 99}, "concurrency"),
                       ({"checks": [{"check": "cost_at_most", "times": -1}]}, "checks")]:
        with pytest.raises(DomainError) as err:
            releases.start_replay(tenant=world.tenant, actor=actor, evaluation_set=s, candidate=world.version, **bad)
        assert err.value.field == field, (bad, err.value.message)


def test_another_tenant_sees_nothing_and_cannot_pick_foreign_runs(world: Any) -> None:
    other = make_world()
    mine = APIClient()
    mine.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    theirs = APIClient()
    theirs.credentials(HTTP_AUTHORIZATION=f"Bearer {other.raw_key}")
    created = mine.post("/api/v1/evaluation-sets", {"name": "yesterday", "agent": world.agent.slug,
                                                    "filters": {"limit": 10}}, format="json")
    assert created.status_code == 201, created.content
    set_id = created.json()["id"]
    assert created.json()["runs"] == 3
    assert theirs.get(f"/api/v1/evaluation-sets/{set_id}").status_code == 404
    assert set_id not in [s["id"] for s in theirs.get("/api/v1/evaluation-sets").json()["results"]]
    run_ids = [str(r.pk) for r in Run.objects.filter(tenant=world.tenant)]
    stolen = theirs.post("/api/v1/evaluation-sets", {"name": "stolen", "agent": other.agent.slug, "run_ids": run_ids},
                         format="json")
    assert stolen.status_code == 400 and stolen.json()["error"]["field"] == "run_ids"
    foreign = theirs.post("/api/v1/replays", {"evaluation_set": set_id, "candidate": {"agent": other.agent.slug, "version": 1}},
                          format="json")
    assert foreign.status_code in (400, 404)
    started = mine.post("/api/v1/replays", {"evaluation_set": set_id, "candidate": {"agent": world.agent.slug, "version": 1}},
                        format="json")
    assert started.status_code == 202, started.content
    batch_id = started.json()["id"]
    assert theirs.get(f"/api/v1/replays/{batch_id}").status_code == 404
    releases.run_shard(batch_id, 0, ReplayBatch.objects.get(pk=batch_id).concurrency)
    for shard in range(1, ReplayBatch.objects.get(pk=batch_id).concurrency):
        releases.run_shard(batch_id, shard, ReplayBatch.objects.get(pk=batch_id).concurrency)
    report = mine.get(f"/api/v1/replays/{batch_id}").json()
    assert report["status"] == "finished" and report["pass_rate"] == 1.0 and report["done"] == 3
    assert EvaluationSet.objects.filter(tenant=other.tenant).count() == 0


def test_a_run_that_waited_for_an_approval_replays_with_the_same_approval_and_no_new_refund(world: Any) -> None:
    from django.contrib.auth import get_user_model

    from accounts import services as tenant_services
    from approvals.decisions import decide
    from approvals.models import ApprovalRequest, ApprovalStatus
    from tenants.models import Role

    refund = world.version.tools[-1]
    from tools.models import Tool
    Tool.objects.filter(tenant=world.tenant, name=refund).update(requires_approval=True)
    run = services.start_run(actor=Actor(api_key=world.key), agent=world.agent,
                             text="refund 30.00 for order O202411280001 because the glass cup broke")
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert run.status == "waiting"
    approver = get_user_model().objects.create_user(username="replay-approver", password="correct-horse-battery")
    tenant_services.set_membership(tenant=world.tenant, user=approver, role=Role.APPROVER, actor=None)
    request = ApprovalRequest.objects.get(run=run, status=ApprovalStatus.PENDING)
    decide(actor=actor_for_user(approver), request_id=request.pk, approve=True)
    assert services.resume_waiting_run(run.pk)
    services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert run.status == "finished" and run.terminal_reason == "final_answer", run.error
    refunds = sum(len(v) for book in order_desk.REFUNDS.values() for v in book.values())
    assert refunds == 1
    actor = actor_for_user(world.operator)
    s = releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="refunds", agent=world.agent, run_ids=[run.pk])
    batch = releases.start_replay(tenant=world.tenant, actor=actor, evaluation_set=s, candidate=world.version,
                                  concurrency=1, checks=[{"check": "no_diff"}, {"check": "no_new_approvals"}])
    releases.run_shard(batch.pk, 0, 1)
    row = ReplayRun.objects.get(batch=batch)
    assert row.diff["approvals"]["recorded"] == ["refund_order"] == row.diff["approvals"]["replayed"]
    assert row.diff["changed"] == [] and row.passed, row.diff
    issued = sum(len(v) for book in order_desk.REFUNDS.values() for v in book.values())
    assert issued == refunds, "the refund was answered from the recording"
    # a stricter candidate: the refund tool dropped from its list -> the call is refused, the answer changes
    strict = AgentVersion.objects.create(tenant=world.tenant, agent=world.agent, number=2, model="demo/planner",
                                         system_prompt=world.version.system_prompt,
                                         tools=[t for t in world.version.tools if t != refund])
    batch = releases.start_replay(tenant=world.tenant, actor=actor, evaluation_set=s, candidate=strict, concurrency=1,
                                  checks=[{"check": "no_diff"}])
    releases.run_shard(batch.pk, 0, 1)
    row = ReplayRun.objects.get(batch=batch)
    assert row.passed is False and row.diff["approvals"]["replayed"] == [] and "approvals" in row.diff["changed"]
    # the model (recorded) still asks for the refund; the candidate refuses it: the same call, another outcome
    assert "tools" in row.diff["changed"]
    [asked] = [c for c in row.diff["tools"]["replayed"] if c["tool"] == "refund_order"]
    assert asked["status"] == "denied"
    assert [c["status"] for c in row.diff["tools"]["recorded"] if c["tool"] == "refund_order"] == ["ok"]


def _total(counter: Any) -> float:
    return sum(s.value for metric in counter.collect() for s in metric.samples if s.name.endswith("_total"))


def test_replays_are_counted_in_their_own_series_never_in_the_tenants_runs(world: Any,
                                                                          django_capture_on_commit_callbacks: Any) -> None:
    from agents.metrics import LLM_COST, LLM_TOKENS, RUNS, TOOL_CALLS
    from releases.metrics import REPLAY_RUNS

    business = [_total(c) for c in (RUNS, LLM_TOKENS, LLM_COST, TOOL_CALLS)]
    passed = REPLAY_RUNS.labels(mode="recorded", result="passed")._value.get()
    with django_capture_on_commit_callbacks(execute=True):
        batch = _replay(world, world.version, checks=[{"check": "no_diff"}])
    assert batch.passed_count == 3
    assert REPLAY_RUNS.labels(mode="recorded", result="passed")._value.get() == passed + 3
    assert [_total(c) for c in (RUNS, LLM_TOKENS, LLM_COST, TOOL_CALLS)] == business


def test_a_running_replay_can_be_cancelled_once_and_stops_before_its_next_chunk(world: Any, monkeypatch: Any) -> None:
    actor = actor_for_user(world.operator)
    s = releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="cancel-me", agent=world.agent)
    batch = releases.start_replay(tenant=world.tenant, actor=actor, evaluation_set=s, candidate=world.version, concurrency=1)
    other = make_world()
    theirs = APIClient()
    theirs.credentials(HTTP_AUTHORIZATION=f"Bearer {other.raw_key}")
    assert theirs.post(f"/api/v1/replays/{batch.pk}/cancel").status_code == 404
    monkeypatch.setattr(releases, "CHUNK", 1)  # one run per chunk: the cancel lands between chunks
    real = releases._replay_chunk

    def chunk_then_cancel(*args: Any) -> None:
        real(*args)
        if ReplayBatch.objects.get(pk=batch.pk).done == 1:
            mine = APIClient()
            mine.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
            answer = mine.post(f"/api/v1/replays/{batch.pk}/cancel")
            assert answer.status_code == 200 and answer.json()["status"] == "cancelled", answer.content

    monkeypatch.setattr(releases, "_replay_chunk", chunk_then_cancel)
    releases.run_shard(batch.pk, 0, 1)
    batch.refresh_from_db()
    assert batch.status == "cancelled" and batch.done == 1 and ReplayRun.objects.filter(batch=batch).count() == 1
    with pytest.raises(DomainError) as err:
        releases.cancel_replay(tenant=world.tenant, actor=actor, batch=batch)
    assert "already ended" in err.value.message





def test_a_member_erased_after_the_set_was_frozen_is_reported_not_dropped(world: Any) -> None:
    from accounts import services as tenant_services
    from agents.erasure import erase_session
    from tenants.models import Role
    from tests.factories import make_user

    actor = actor_for_user(world.operator)
    s = releases.create_evaluation_set(tenant=world.tenant, actor=actor, name="frozen", agent=world.agent)
    gone = Run.objects.filter(tenant=world.tenant, input=QUESTIONS[0]).get()
    owner = make_user(f"{world.tenant.slug}-owner")
    tenant_services.set_membership(tenant=world.tenant, user=owner, role=Role.OWNER, actor=None)
    erase_session(actor=actor_for_user(owner), session=gone.session, reason="user asked")
    batch = releases.start_replay(tenant=world.tenant, actor=actor, evaluation_set=s, candidate=world.version, concurrency=1)
    releases.run_shard(batch.pk, 0, 1)
    batch.refresh_from_db()
    assert s.members.count() == 3 and batch.total == 3 and batch.done == 3 and batch.status == "finished"
    row = ReplayRun.objects.get(batch=batch, source_run=gone)
    assert row.status == "skipped" and "erased" in row.error and row.passed is None
    assert batch.passed_count == 2 and batch.pass_rate == 1.0
    assert releases.batch_report(batch)["skipped"] == 1


def test_a_recording_holds_the_turns_its_run_saw_and_no_later_one(world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs as recorded: each run of a conversation replays with the turns before it, newest first, at most what
    the context builder reads (HISTORY_TURNS); a later turn of the same session never leaks in."""
    from agents import engine
    from releases import recording

    monkeypatch.setattr(engine, "HISTORY_TURNS", 2)
    monkeypatch.setattr(recording, "HISTORY_TURNS", 2)
    first = services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text=QUESTIONS[0])
    services.execute_run(str(first.pk))
    first.refresh_from_db()
    runs = [first]
    for text in QUESTIONS[1:] + QUESTIONS[:1]:
        run = services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text=text, session=first.session)
        services.execute_run(str(run.pk))
        runs.append(run)
    recs = {r.run.pk: r for r in recording.load([runs[3].pk, runs[1].pk])}
    assert [t.run_id for t in recs[runs[1].pk].earlier_turns] == [runs[0].pk]
    assert [t.run_id for t in recs[runs[3].pk].earlier_turns] == [runs[2].pk, runs[1].pk], \
        "newest first, two at most, none after the run"
