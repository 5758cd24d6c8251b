"""The durable side of runs, in-process: one transaction per step, resume, crash loop, sweeper, memory, cancel.

Runs go through the real path (``services.execute_run`` -> ``engine.build_loop`` -> DjangoRunStore +
ToolGateway) with a scripted model in place of the planner; a worker "dies" by raising a
BaseException out of the loop, which skips every ``except Exception`` and leaves the lease behind.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from agents import model_clients, services
from agents.engine import build_loop
from agents.models import Run, RunEvent, RunMessage, RunStatus, Session, Turn
from agents.store import DjangoRunStore
from agents.sweeper import stranded_runs, sweep_runs
from audit.models import ToolCallAudit
from audit.unit_of_work import StepAudit
from core.batch import WriteBatch
from runtime.protocols import StepRecord
from runtime.scripted import ScriptedModel, call, say
from runtime.types import Event, ModelRequest, ModelResponse, Phase, Usage
from tenants.scoping import actor_for_user
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db

ORDERS = ["O202411280001", "O202411280002", "O202411280003"]
#: Five tool steps with distinct (tool, arguments) so loop detection stays quiet, then an answer.
TOOL_STEPS = [call(tool, {"order_id": order}) for order in ORDERS for tool in ("query_order", "query_logistics")][:5]


class WorkerDied(BaseException):
    """Stands for SIGKILL: nothing in the worker catches it, so the lease stays behind."""


@pytest.fixture
def world() -> World:
    return make_world(max_recursion=8)


@pytest.fixture
def use_model(monkeypatch: pytest.MonkeyPatch) -> Callable[[ScriptedModel], ScriptedModel]:
    def use(model: ScriptedModel) -> ScriptedModel:
        monkeypatch.setattr(model_clients, "model_client_for", lambda run: model)
        return model

    return use


def _start(world: World, text: str = "check my orders", session: Session | None = None) -> Run:
    return services.start_run(actor=actor_for_user(world.operator), agent=world.agent, text=text, session=session)


def _die_at_model_call(use_model: Callable[[ScriptedModel], ScriptedModel], run: Run, replies: list[Any]) -> None:
    """A worker takes the run, commits a step per scripted reply, and dies at the next model call."""

    def die(request: ModelRequest) -> ModelResponse:
        raise WorkerDied

    use_model(ScriptedModel([*replies, die]))
    token = uuid.uuid4().hex
    taken = services.acquire_lease(str(run.pk), token)
    assert taken is not None
    with pytest.raises(WorkerDied):
        build_loop(taken, token).run(str(run.pk))


def _expire_lease(run: Run) -> None:
    """Time passes: the lease ran out, and the last commit (or take-over) was a lease period before that."""
    expired = timezone.now() - dt.timedelta(seconds=1)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=expired, updated_at=expired - dt.timedelta(seconds=settings.RUN_LEASE_SECONDS))


def _assert_trace_is_whole(run: Run) -> list[RunEvent]:
    events = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "seq is gapless"
    assert [e.step for e in events] == sorted(e.step for e in events), "steps never go back"
    assert [e.type for e in events].count("run.started") == 1
    assert [e.type for e in events].count("run.finished") == 1
    model_calls = [e.step for e in events if e.type == "model.call"]
    assert len(model_calls) == len(set(model_calls)), f"one model call per step, got steps {model_calls}"
    indexes = list(RunMessage.objects.filter(run=run).order_by("index").values_list("index", flat=True))
    assert indexes == list(range(len(indexes))), "the message log is gapless"
    call_ids = list(ToolCallAudit.objects.filter(run=run).values_list("call_id", flat=True))
    assert len(call_ids) == len(set(call_ids)), "each tool call is audited once"
    return events


# -- one transaction per step ------------------------------------------------------------------------


def test_a_step_commits_checkpoint_events_messages_and_audit_together(world: World, use_model: Any) -> None:
    # given a run whose third step fails half-way through its commit: its writes (events, messages, audit
    # rows, chain head, checkpoint) have reached the database, the transaction has not committed
    run = _start(world)
    use_model(ScriptedModel([*TOOL_STEPS[:3], say("done")]))
    calls = {"n": 0}
    real = WriteBatch.execute

    def flaky(self: WriteBatch) -> None:
        real(self)
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk full")

    token = uuid.uuid4().hex
    taken = services.acquire_lease(str(run.pk), token)
    assert taken is not None
    loop = build_loop(taken, token)
    WriteBatch.execute = flaky  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="disk full"):
            loop.run(str(run.pk))
    finally:
        WriteBatch.execute = real  # type: ignore[method-assign]
    # then steps 1-2 are durable and nothing of step 3 is: no event, message, audit row or checkpoint
    run.refresh_from_db()
    assert run.step == 2
    assert set(RunEvent.objects.filter(run=run).values_list("step", flat=True)) == {1, 2}
    assert set(RunMessage.objects.filter(run=run).values_list("step", flat=True)) == {1, 2}
    assert set(ToolCallAudit.objects.filter(run=run).values_list("step", flat=True)) == {1, 2}
    assert run.last_seq == RunEvent.objects.filter(run=run).count()
    assert run.message_count == RunMessage.objects.filter(run=run).count()


@dataclass
class WriteMeter:
    """Counts statements and the bytes of text/JSON that INSERT/UPDATE statements write."""

    queries: int = 0
    written: int = 0
    marks: list[tuple[int, int]] = field(default_factory=list)

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.queries += 1
        # a step's writes are one "WITH w0 AS (INSERT …) … UPDATE …" statement on PostgreSQL (core/batch.py)
        if sql.lstrip()[:6].upper() in ("INSERT", "UPDATE", "WITH W") and params:
            for row in params if many else [params]:
                self.written += sum(_size(p) for p in row)
        return execute(sql, params, many, context)

    def mark(self) -> None:
        self.marks.append((self.queries, self.written))

    def per_step(self) -> list[tuple[int, int]]:
        """(queries, bytes) between consecutive marks: one mark per model call, i.e. per step."""
        return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(self.marks, self.marks[1:], strict=False)]


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, list | tuple):  # PostgreSQL's bulk insert passes a column as an array (UNNEST)
        return sum(_size(v) for v in value)
    if hasattr(value, "obj"):  # psycopg's Json/Jsonb wrapper
        return len(json.dumps(value.obj, default=str).encode())
    return 0


def _session_with_history(world: World, turns: int) -> Session:
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    runs = Run.objects.bulk_create(
        Run(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input=f"question {i}",
            status=RunStatus.FINISHED, terminal_reason="final_answer", output=f"answer {i} " + "x" * 80)
        for i in range(turns)
    )
    Turn.objects.bulk_create(
        Turn(tenant=world.tenant, session=session, turn_seq=i + 1, run=r, user_message=r.input, assistant_message=r.output)
        for i, r in enumerate(runs)
    )
    Session.objects.filter(pk=session.pk).update(turns=turns)
    return Session.objects.get(pk=session.pk)


def _measured_run(world: World, use_model: Any, history_turns: int) -> list[tuple[int, int]]:
    meter = WriteMeter()

    def marking(reply: ModelResponse) -> Callable[[ModelRequest], ModelResponse]:
        def reply_fn(request: ModelRequest) -> ModelResponse:
            meter.mark()
            return reply

        return reply_fn

    def last(request: ModelRequest) -> ModelResponse:
        meter.mark()
        return say("done")

    use_model(ScriptedModel([*(marking(r) for r in TOOL_STEPS), last]))
    run = _start(world, session=_session_with_history(world, history_turns))
    with connection.execute_wrapper(meter):
        services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert run.terminal_reason == "final_answer", run.error
    assert len(meter.marks) == 6
    return meter.per_step()


def test_queries_and_bytes_per_step_do_not_grow_with_the_conversation(world: World, use_model: Any) -> None:
    # given the same five-tool-step run after 5 and after 50 earlier turns of the session (10 / 100 messages)
    short = _measured_run(world, use_model, 5)
    long = _measured_run(world, use_model, 50)
    # then steps 2..5 (each: one tool call, one commit) cost the same number of queries whatever the history,
    short_queries, long_queries = [q for q, _ in short[1:]], [q for q, _ in long[1:]]
    assert len(set(short_queries)) == 1 and short_queries == long_queries, (short, long)
    if connection.vendor == "postgresql":
        # a tool step is the tool's policy read, then its transaction: the run row and the audit chain head
        # locked in one statement, and every write of the step (events, message, sealed audit row, chain
        # head, checkpoint) in one statement (core/batch.py). (Inside the test's own transaction the step's
        # is a savepoint: SAVEPOINT and RELEASE are two statements more, where a worker has BEGIN and COMMIT.)
        assert short_queries[0] == 3 + 2, short
    # and write about the same bytes (messages are appended, never re-saved), while step 1 (which
    # persists the assembled context once) is where the history shows
    for (_, a), (_, b) in zip(short[1:], long[1:], strict=True):
        assert abs(a - b) <= 0.1 * a, (short, long)
    assert long[0][1] > short[0][1] + 45 * 80


def test_a_step_is_never_committed_twice_nor_by_a_worker_that_lost_its_lease(world: World, use_model: Any) -> None:
    run = _start(world)
    use_model(ScriptedModel([TOOL_STEPS[0], say("done")]))
    token = uuid.uuid4().hex
    taken = services.acquire_lease(str(run.pk), token)
    assert taken is not None
    store = DjangoRunStore(taken, token, initial=lambda: None, audit=StepAudit())  # type: ignore[arg-type,return-value]

    def record(step: int) -> StepRecord:
        return StepRecord(step=step, phase=Phase.OBSERVING, appended_messages=[{"role": "user", "content": "x"}],
                          state={}, usage=Usage(), events=[Event("state.transition", {"to": "observing"})])

    assert not store.commit_step(str(run.pk), record(1)).lease_lost
    # when step 1 is offered again (a second worker that resumed from step 0), or step 3 skips step 2
    assert store.commit_step(str(run.pk), record(1)).lease_lost
    assert store.commit_step(str(run.pk), record(3)).lease_lost
    # or a worker whose lease another worker took commits step 2
    stale = DjangoRunStore(taken, "not-the-lease", initial=lambda: None, audit=StepAudit())  # type: ignore[arg-type,return-value]
    assert stale.commit_step(str(run.pk), record(2)).lease_lost
    # then only the first commit is there
    assert RunEvent.objects.filter(run=run).count() == 1
    assert RunMessage.objects.filter(run=run).count() == 1
    assert Run.objects.get(pk=run.pk).step == 1


# -- resume, crash loop, sweeper -------------------------------------------------------------------


def test_a_run_whose_worker_died_resumes_from_its_last_committed_step(
    world: World, use_model: Any, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a worker that committed two steps and died in the third
    run = _start(world)
    _die_at_model_call(use_model, run, TOOL_STEPS[:2])
    run.refresh_from_db()
    assert (run.status, run.step, bool(run.lease_token)) == (RunStatus.RUNNING, 2, True)
    # when its lease expires, the sweeper re-enqueues it
    sent: list[str] = []
    monkeypatch.setattr("agents.tasks.execute_run_task.delay", lambda run_id: sent.append(run_id))
    assert str(run.pk) not in stranded_runs()[0], "a live lease is left alone"
    _expire_lease(run)
    with django_capture_on_commit_callbacks(execute=True):
        report = sweep_runs()
    assert report.lease_expired == [str(run.pk)] and sent == [str(run.pk)]
    # and a new worker executes the task
    model = use_model(ScriptedModel([TOOL_STEPS[2], say("all three orders checked")]))
    services.execute_run(str(run.pk))
    # then it went on from step 3 (the model saw steps 1-2's results), with one crash counted
    run.refresh_from_db()
    assert (run.status, run.terminal_reason, run.step, run.crash_count) == ("finished", "final_answer", 4, 1)
    seen = [m.get("tool_call_id") for m in model.requests[0].messages if m.get("role") == "tool"]
    assert len(seen) == 2, "the resumed run's first request carries the committed tool results"
    events = _assert_trace_is_whole(run)
    assert [e.step for e in events if e.type == "model.call"] == [1, 2, 3, 4]
    assert ToolCallAudit.objects.filter(run=run).count() == 3
    assert not Run.objects.get(pk=run.pk).lease_token


def test_a_run_that_crashes_its_worker_three_times_ends_as_crash_loop(world: World, use_model: Any) -> None:
    run = _start(world)
    for _ in range(services.MAX_CRASHES):
        _die_at_model_call(use_model, run, [])
        _expire_lease(run)
    assert Run.objects.get(pk=run.pk).crash_count == services.MAX_CRASHES - 1
    # when the next worker takes it (the third dead worker's lease is the third crash)
    model = use_model(ScriptedModel([say("never asked")]))
    services.execute_run(str(run.pk))
    # then it ends as error, saying why, and no model call was made
    run.refresh_from_db()
    assert (run.status, run.terminal_reason, run.crash_count) == ("finished", "error", services.MAX_CRASHES)
    assert run.error.startswith("crash_loop:")
    assert not model.requests and not run.lease_token
    finished = RunEvent.objects.get(run=run, type="run.finished")
    assert finished.payload["terminal_reason"] == "error" and "crash_loop" in finished.payload["reason"]
    assert [e.seq for e in RunEvent.objects.filter(run=run).order_by("seq")] == list(range(1, run.last_seq + 1))


def test_the_sweeper_picks_dead_and_lost_runs_only_once_per_quiet_period(world: World, settings: Any) -> None:
    settings.SWEEP_QUEUED_AFTER_SECONDS = 60
    now = timezone.now()
    long_ago = now - dt.timedelta(seconds=120)

    def run_with(**fields: Any) -> str:
        run = _start(world)
        Run.objects.filter(pk=run.pk).update(**fields)
        return str(run.pk)

    fresh_queued = run_with()
    lost_queued = run_with(updated_at=long_ago, created_at=long_ago)
    leased = run_with(status=RunStatus.RUNNING, lease_token="t", lease_expires_at=now + dt.timedelta(seconds=300), updated_at=long_ago)
    dead = run_with(status=RunStatus.RUNNING, lease_token="t", lease_expires_at=now - dt.timedelta(seconds=5),
                    updated_at=now - dt.timedelta(seconds=10))
    waiting = run_with(status=RunStatus.WAITING, updated_at=long_ago)
    _pending_approval(world, waiting)  # a person has yet to decide: nothing to resume
    finished = run_with(status=RunStatus.FINISHED, updated_at=long_ago)
    # a dead run re-enqueued a while ago whose new lease also expired is picked again at once
    dead_again = run_with(status=RunStatus.RUNNING, lease_token="t2", lease_expires_at=now - dt.timedelta(seconds=1),
                          updated_at=now - dt.timedelta(seconds=20))
    dead_ids, lost_ids = stranded_runs(now)
    assert set(dead_ids) == {dead, dead_again} and lost_ids == [lost_queued]
    assert not {fresh_queued, leased, waiting, finished} & set(dead_ids + lost_ids)
    # once swept, they are marked and left alone until the quiet period passed
    assert sweep_runs(now).requeued == 3
    assert stranded_runs(now + dt.timedelta(seconds=10)) == ([], [])
    later = now + dt.timedelta(seconds=61)
    dead_later, lost_later = stranded_runs(later)
    assert set(dead_later) == {dead, dead_again}
    assert set(lost_later) == {lost_queued, fresh_queued}, "the fresh queued run is now a minute old too"


def _pending_approval(world: World, run_id: str, status: str = "pending") -> Any:
    from approvals.models import ApprovalRequest

    return ApprovalRequest.objects.create(tenant=world.tenant, run_id=run_id, step=1, call_id="call-1", tool_name="refund_order",
                                          arguments={}, arguments_hash="x", status=status,
                                          expires_at=timezone.now() + dt.timedelta(hours=1))


def test_a_waiting_run_whose_resume_was_lost_after_its_decision_is_resumed_by_the_sweeper(
        world: World, settings: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    # given runs waiting for a long time: one whose approval was decided but whose resume never happened (PostgreSQL
    # went away between the decision's commit and the resume: issue #50's fault suite), one still awaiting a person,
    # one whose sub-agent run is still waiting for a person, and one decided a moment ago (its resume is on its way)
    settings.SWEEP_QUEUED_AFTER_SECONDS = 60
    now = timezone.now()
    long_ago = now - dt.timedelta(seconds=120)

    def waiting(**fields: Any) -> str:
        run = _start(world)
        Run.objects.filter(pk=run.pk).update(status=RunStatus.WAITING, **fields)
        return str(run.pk)

    decided = waiting(updated_at=long_ago)
    _pending_approval(world, decided, status="approved")
    undecided = waiting(updated_at=long_ago)
    _pending_approval(world, undecided)
    parent = waiting(updated_at=long_ago)
    child = waiting(facts={"parent_run": parent})
    _pending_approval(world, child)
    just_decided = waiting(updated_at=now - dt.timedelta(seconds=5))
    _pending_approval(world, just_decided, status="approved")
    sent: list[str] = []
    monkeypatch.setattr("agents.tasks.execute_run_task.delay", lambda run_id: sent.append(run_id))
    # when the sweeper looks
    with django_capture_on_commit_callbacks(execute=True):
        report = sweep_runs(now)
    # then only the decided run is resumed, once, as its decision would have
    assert report.lost_resume == [decided] and sent == [decided], (report, sent)
    assert Run.objects.get(pk=decided).status == RunStatus.QUEUED
    assert {Run.objects.get(pk=pk).status for pk in (undecided, parent, child, just_decided)} == {RunStatus.WAITING}
    with django_capture_on_commit_callbacks(execute=True):
        assert sweep_runs(now).lost_resume == []


def test_the_sweep_command_reports_what_it_enqueued(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    from django.core.management import call_command

    call_command("sweep_runs")
    assert "re-enqueued 0 run(s)" in capsys.readouterr().out


def test_an_extra_tool_module_that_cannot_be_imported_stops_start_up_with_its_name() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DEBUG="true", AGENTOPS_EXTRA_TOOL_MODULES="tests.support.slow_tools, acme_tools.nowhere")
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=Path(__file__).resolve().parents[2], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "AGENTOPS_EXTRA_TOOL_MODULES names 'acme_tools.nowhere'" in result.stderr


# -- session memory and cancel --------------------------------------------------------------------


def test_the_second_run_of_a_session_starts_with_the_first_exchange(world: World, use_model: Any) -> None:
    use_model(ScriptedModel([TOOL_STEPS[0], say("Order O202411280001 is shipped.")]))
    first = _start(world, "where is order O202411280001?")
    services.execute_run(str(first.pk))
    second_model = use_model(ScriptedModel([say("You asked about O202411280001.")]))
    second = _start(world, "what did I ask before?", session=first.session)
    services.execute_run(str(second.pk))
    log = [(m["role"], m.get("content")) for m in RunMessage.objects.filter(run=second).order_by("index").values_list("message", flat=True)]
    assert ("user", "where is order O202411280001?") in log
    assert ("assistant", "Order O202411280001 is shipped.") in log
    assert log.index(("user", "where is order O202411280001?")) < log.index(("user", "what did I ask before?"))
    sent = [(m["role"], m.get("content")) for m in second_model.requests[0].messages]
    assert ("assistant", "Order O202411280001 is shipped.") in sent


def test_cancel_through_the_api_takes_effect_at_the_next_step_boundary(world: World, use_model: Any) -> None:
    # given a run whose operator cancels it through the API while step 2's model call is in flight
    run = _start(world)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {world.raw_key}")
    answers: list[Any] = []

    def cancel_then_call(request: ModelRequest) -> ModelResponse:
        answers.append(api.post(f"/api/v1/runs/{run.pk}/cancel"))
        return TOOL_STEPS[1]

    model = use_model(ScriptedModel([TOOL_STEPS[0], cancel_then_call, TOOL_STEPS[2], say("done")]))
    services.execute_run(str(run.pk))
    # then the API accepted it while the run was running, step 2 finished (its tool call included),
    # and the run ended as cancelled right after, without a third model call
    assert answers[0].status_code == 202 and answers[0].json()["cancel_requested"] is True
    assert answers[0].json()["status"] == "running"
    run.refresh_from_db()
    assert (run.status, run.terminal_reason, run.step) == ("finished", "cancelled", 3)
    assert len(model.requests) == 2
    assert ToolCallAudit.objects.filter(run=run).count() == 2
    _assert_trace_is_whole(run)


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Enqueues made on commit go nowhere: each test drives the worker side itself."""
    monkeypatch.setattr("agents.tasks.execute_run_task.delay", lambda run_id: None)
    yield


def test_a_finished_run_gives_its_lease_back_in_its_last_commit_and_the_worker_reads_nothing_after(
        world: World, use_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.test.utils import CaptureQueriesContext

    released: list[str] = []
    real_release = services.release_lease
    monkeypatch.setattr(services, "release_lease", lambda run_id, token: (released.append(str(run_id)), real_release(run_id, token)))
    # a run that finishes: its last commit cleared the lease, so the worker neither releases it nor looks for a pause
    run = _start(world)
    use_model(ScriptedModel([TOOL_STEPS[0], say("done")]))
    with CaptureQueriesContext(connection) as queries:
        services.execute_run(str(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.FINISHED and run.lease_token == "" and run.lease_expires_at is None
    assert released == []
    last_commit = max(i for i, q in enumerate(queries.captured_queries) if '"agents_turn"' in q["sql"])  # the session's turn
    assert [q["sql"] for q in queries.captured_queries[last_commit + 1 :] if "agents_run" in q["sql"]] == []
    # a worker whose step cannot commit still gives the lease back (the run is finished as an internal error)
    failing = _start(world)
    use_model(ScriptedModel([say("done")]))

    def disk_full(self: WriteBatch) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(WriteBatch, "execute", disk_full)
    services.execute_run(str(failing.pk))
    failing.refresh_from_db()
    assert released == [str(failing.pk)]
    assert failing.lease_token == "" and failing.status == RunStatus.FINISHED and "RuntimeError" in failing.error
