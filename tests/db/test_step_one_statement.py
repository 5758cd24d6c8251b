"""A step after the run's first commits in ONE statement (agents/store.py ``_commit_guarded``): its writes happen
only if the run's row and the tenant's audit chain head are as the worker's last commit left them, checked under
their locks; when another writer came between (another run's audit row, a stolen lease, an appended event), the
statement writes nothing and the step commits the locked way, which sees what changed. PostgreSQL only (elsewhere
every step takes the locked way); outside a test transaction, since the statement commits by itself."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from agents import model_clients, services
from agents.models import AgentVersion, Run, RunEvent, RunMessage, RunStatus, Session
from agents.store import DjangoRunStore, event_rows
from audit.chain import lock_head, verify_tenant, write_sealed
from audit.models import ToolCallAudit
from runtime.scripted import ScriptedModel, call, say
from runtime.types import Event
from tests.factories import World, make_world

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement step is PostgreSQL's (CI runs it)"),
]

ORDER = "O202411280001"


@pytest.fixture
def world() -> World:
    world = make_world(max_recursion=12)
    # the same call again and again is what these runs do: the loop detector would end them
    AgentVersion.objects.filter(pk=world.version.pk).update(
        policy={"limits": {"max_recursion": 12}, "loop_detection": {"enabled": False}})
    world.version.refresh_from_db()
    with transaction.atomic():
        lock_head(world.tenant.pk)  # a tenant with history has its chain head (its very first row creates it)
    return world


def _run(world: World) -> Run:
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    return Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input="orders")


def _execute(monkeypatch: pytest.MonkeyPatch, run: Run, steps: int, between: dict[int, Callable[[], None]] | None = None,
             ) -> dict[int, str]:
    """Run ``steps`` tool steps then an answer; ``between[k]`` runs just before model call k+1 (after step k's
    commit). Returns, per step, the way it committed ("guarded" or "locked")."""
    between = between or {}

    def reply(n: int, response: Any) -> Callable[[Any], Any]:
        def answer(request: Any) -> Any:
            if n in between:
                between[n]()
            return response

        return answer

    model = ScriptedModel([*(reply(n, call("query_order", {"order_id": ORDER})) for n in range(steps)), reply(steps, say("done"))])
    monkeypatch.setattr(model_clients, "model_client_for", lambda run: model)
    ways: dict[int, str] = {}
    real_guarded, real_locked = DjangoRunStore._commit_guarded, DjangoRunStore._commit_locked

    def guarded(store: DjangoRunStore, record: Any, now: Any) -> Any:
        ack = real_guarded(store, record, now)
        if ack is not None:
            ways[record.step] = "guarded"
        return ack

    def locked(store: DjangoRunStore, record: Any, now: Any) -> Any:
        ways[record.step] = "locked"
        return real_locked(store, record, now)

    monkeypatch.setattr(DjangoRunStore, "_commit_guarded", guarded)
    monkeypatch.setattr(DjangoRunStore, "_commit_locked", locked)
    services.execute_run(str(run.pk))
    return ways


def _seqs_contiguous(run: Run) -> None:
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)) and Run.objects.get(pk=run.pk).last_seq == len(seqs)


@pytest.fixture
def statements() -> Iterator[list[str]]:
    seen: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield seen


def test_after_the_first_step_a_tool_step_is_the_policy_read_and_one_statement(
    world: World, monkeypatch: pytest.MonkeyPatch, statements: list[str]
) -> None:
    run = _run(world)
    marks: list[int] = []
    ways = _execute(monkeypatch, run, 4, {n: (lambda n=n: marks.append(len(statements))) for n in range(5)})
    assert ways == {1: "locked", 2: "guarded", 3: "guarded", 4: "guarded", 5: "locked"}  # the first reads; the last closes
    # step 3 (between model calls 3 and 4): the tool's policy read, then the step's one statement, no BEGIN/COMMIT
    step3 = statements[marks[2]:marks[3]]
    assert len(step3) == 2 and step3[1].startswith("WITH g AS (SELECT"), step3
    done = Run.objects.get(pk=run.pk)
    assert done.status == RunStatus.FINISHED and done.terminal_reason == "final_answer" and done.step == 5
    _seqs_contiguous(run)
    indexes = list(RunMessage.objects.filter(run=run).order_by("index").values_list("index", flat=True))
    assert indexes == list(range(done.message_count)) and done.message_count > 0
    assert ToolCallAudit.objects.filter(run=run).count() == 4
    assert verify_tenant(world.tenant.pk) == (4, None)  # every row sealed in order after the one before


def test_another_runs_audit_row_between_steps_sends_the_step_the_locked_way_and_the_chain_holds(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, other = _run(world), _run(world)

    def other_run_writes() -> None:  # another run of the tenant seals a row: the chain head moves
        row = ToolCallAudit(tenant_id=world.tenant.pk, run_id=other.pk, agent_id=world.agent.pk, version_id=world.version.pk,
                            session_id=other.session_id, tool_name="query_order", call_id="other-1", status="ok", step=1)
        with transaction.atomic():
            write_sealed([type("Write", (), {"row": row, "started_pk": None})()], world.tenant.pk)

    ways = _execute(monkeypatch, run, 4, {2: other_run_writes})
    # refused once: the tenant is busy, so the worker's later steps go the locked way (no statement wasted on each)
    assert ways == {1: "locked", 2: "guarded", 3: "locked", 4: "locked", 5: "locked"}, ways
    assert Run.objects.get(pk=run.pk).terminal_reason == "final_answer"
    _seqs_contiguous(run)
    assert ToolCallAudit.objects.filter(run=run).count() == 4
    assert verify_tenant(world.tenant.pk) == (5, None)


def test_an_event_appended_by_another_writer_between_steps_keeps_every_seq_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(world)

    def note() -> None:  # as finish_without_worker and the attention marks append: under the run's lock, last_seq moved
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            RunEvent.objects.bulk_create(event_rows(locked, locked.last_seq + 1, locked.step, [Event("note", {"by": "test"})]))
            Run.objects.filter(pk=run.pk).update(last_seq=locked.last_seq + 1)

    ways = _execute(monkeypatch, run, 3, {2: note})
    assert ways[3] == "locked", ways
    assert Run.objects.get(pk=run.pk).terminal_reason == "final_answer"
    _seqs_contiguous(run)
    assert RunEvent.objects.filter(run=run, type="note").count() == 1


def test_a_lease_taken_between_steps_writes_nothing_of_the_step(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run(world)

    def steal() -> None:  # another worker took the run (its lease expired, the sweeper gave it on)
        Run.objects.filter(pk=run.pk).update(lease_token="another-worker")

    ways = _execute(monkeypatch, run, 4, {2: steal})
    after = Run.objects.get(pk=run.pk)
    assert ways == {1: "locked", 2: "guarded", 3: "locked"}, ways  # the guard refused step 3; the lock saw the lease gone
    assert after.step == 2 and after.lease_token == "another-worker"  # step 3 not committed, nothing after it
    assert ToolCallAudit.objects.filter(run=run).count() == 2
    assert not RunEvent.objects.filter(run=run, step=3).exists()
    _seqs_contiguous(run)
    assert verify_tenant(world.tenant.pk) == (2, None)


def test_the_lease_is_renewed_a_third_of_its_length_at_a_time_and_the_runs_row_updated_in_place(
    world: World, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    import time

    from agents import store

    settings.RUN_LEASE_SECONDS = 90  # renewed once 30 s have passed since this store last wrote it
    run = _run(world)
    clock = [1000.0]
    monkeypatch.setattr(store.time, "monotonic", lambda: clock[0])
    expiries: dict[int, Any] = {}

    def look(n: int) -> Callable[[], None]:
        def between() -> None:
            expiries[n] = Run.objects.values_list("lease_expires_at", flat=True).get(pk=run.pk)
            clock[0] += 11  # 11 s a step: steps 1 and 4 renew (0 s, 33 s), 2 and 3 do not
        return between

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_tuples_hot_updated(%s::regclass)", ["agents_run"])
        hot_before = cursor.fetchone()[0]
    ways = _execute(monkeypatch, run, 5, {n: look(n) for n in range(1, 6)})
    assert ways[2] == ways[3] == ways[4] == "guarded"
    assert expiries[1] == expiries[2] == expiries[3]  # steps 2 and 3 left the lease as step 1 wrote it
    assert expiries[4] > expiries[3] and expiries[4] == expiries[5]  # step 4 renewed it: 33 s since step 1
    assert Run.objects.get(pk=run.pk).lease_expires_at is None  # the last step gave the lease back

    # The table keeps room on its pages, so a step that changes no indexed column updates its row in place.
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'agents_run'")
        assert "fillfactor=80" in (cursor.fetchone()[0] or [])
        # A backend hands its counts to the shared statistics at the end of a transaction, at most once a second.
        time.sleep(1.1)
        cursor.execute("SELECT 1")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT pg_stat_get_tuples_hot_updated(%s::regclass)", ["agents_run"])
        hot_after = cursor.fetchone()[0]
    assert hot_after - hot_before >= 2, (hot_before, hot_after)  # steps 2 and 3 at least
