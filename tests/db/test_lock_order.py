"""Issue #50, hole 2: one lock order, and a deadlock or serialization failure is retried, never a failed run.

The order (``audit/chain.py``): a run's row, its tenant's row (``FOR NO KEY UPDATE``: it never blocks the ``FOR KEY
SHARE`` that a foreign-key check takes at commit), the tenant's audit chain head. A flow's completion takes the tenant's
row then the head; an agent step holds the head and, at its commit, checks its new rows' foreign keys to the tenant.
With the tenant's row taken ``FOR UPDATE`` those two waited for each other: PostgreSQL's ``deadlock detected``, and
the run ended ``internal error: OperationalError``. Whatever conflict is left (another order somewhere, a
serialization failure) rolls back one transaction, which is run again: the run finishes.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.db.utils import OperationalError

from agents import acceptance, services
from agents.models import Run, RunEvent
from agents.store import _LOCK_SQL as AGENT_STEP_LOCK
from audit.chain import lock_head
from audit.models import ToolCallAudit
from core.batch import WriteBatch
from flows import store
from tests.db.test_flow_runs import ORDER, client_for, drain, lookup, make_flow, start
from tests.factories import World

pytestmark = pytest.mark.django_db

ON_POSTGRES = connection.vendor == "postgresql"


def _agent_run(world: World) -> str:
    answer = client_for(world.raw_key).post("/api/v1/runs", {"agent": "order-assistant", "input": f"Where is {ORDER}?"},
                                            format="json")
    assert answer.status_code == 202, answer.content
    return str(answer.json()["id"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not ON_POSTGRES, reason="row locks and concurrent transactions: PostgreSQL (CI runs this file there)")
def test_a_flow_completion_and_an_agent_step_of_one_tenant_take_their_locks_without_a_deadlock(world: World) -> None:
    """The agent step holds the chain head and commits rows that reference the tenant; the flow's completion locks
    the tenant's row and waits for the head. The step's commit must not wait for the flow's lock on the tenant."""
    from tests.support.concurrency import other_transaction, waits_for

    make_flow(world, {"nodes": [lookup("a")]})
    flow_run = Run.objects.get(pk=start(world, {"flow": "desk", "input": {"order_id": ORDER}}).json()["id"])
    agent_run = _agent_run(world)
    with transaction.atomic():
        lock_head(world.tenant.pk)  # the tenant's chain head exists (it has audit rows)

    def flow_completion_locks() -> bool:
        with transaction.atomic():
            found, head = store.lock(flow_run, with_head=True)
            return found and head is not None

    with other_transaction() as step:
        # an agent step's locked commit: its run's row and the chain head, then its rows (foreign keys to the tenant,
        # checked at commit: Django's constraints are deferred)
        step.execute(AGENT_STEP_LOCK[True], [agent_run])
        step.execute(
            'INSERT INTO "audit_toolcallaudit" (tenant_id, run_id, step, call_id, attempt_call_ids, span_id, tool_name, '
            "arguments_summary, arguments_hash, status, error, latency_ms, result_size, idempotency_key, created_at, "
            "chain_seq, prev_hash, row_hash) VALUES (%s, %s, 1, 'c1', %s, 's', 'query_order', '{}', '', 'ok', '', 0, 0, "
            "'', now(), 1, '', '')", [world.tenant.pk, agent_run, json.dumps(["c1"])])
        try:
            assert waits_for(flow_completion_locks, step.commit, what="the chain head the agent step holds")
        except psycopg.errors.DeadlockDetected as exc:  # the step's commit was the deadlock's victim
            pytest.fail(f"the agent step's commit deadlocked with the flow's lock: {exc}")
    assert ToolCallAudit.objects.filter(run_id=agent_run, call_id="c1").exists()


def _deadlock() -> OperationalError:
    """What Django raises for PostgreSQL's ``deadlock detected`` (psycopg's error as its cause)."""
    try:
        raise OperationalError("deadlock detected") from psycopg.errors.DeadlockDetected("deadlock detected")
    except OperationalError as exc:
        return exc


def _first_writes_deadlock(monkeypatch: pytest.MonkeyPatch, times: int = 1) -> list[int]:
    """The next ``times`` batches are sent and then their transaction is the victim of a deadlock (rolled back)."""
    execute = WriteBatch.execute
    hits: list[int] = []

    def victim(self: WriteBatch, *args: Any, **kwargs: Any) -> Any:
        result = execute(self, *args, **kwargs)
        if len(hits) < times:
            hits.append(1)
            raise _deadlock()
        return result

    monkeypatch.setattr(WriteBatch, "execute", victim)
    return hits


def test_a_flow_completion_that_lost_a_deadlock_is_committed_again_and_the_run_finishes(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    make_flow(world, {"nodes": [lookup("a"), lookup("b", ["a"])], "output": "nodes.b.carrier"})
    run_id = start(world, {"flow": "desk", "input": {"order_id": ORDER}}).json()["id"]
    services.execute_run(run_id)
    hits = _first_writes_deadlock(monkeypatch)
    run = Run.objects.get(pk=run_id)
    drain(run)
    assert hits == [1]
    assert run.terminal_reason == "final_answer", run.error
    finished = [e.payload["node"] for e in RunEvent.objects.filter(run=run, type="flow.node.finished")]
    assert sorted(finished) == ["a", "b"]  # each completion committed once


def test_an_agent_step_that_lost_a_deadlock_is_committed_again_and_the_run_finishes(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _agent_run(world)
    hits = _first_writes_deadlock(monkeypatch, times=2)
    services.execute_run(run_id)
    run = Run.objects.get(pk=run_id)
    assert hits == [1, 1]
    assert run.status == "finished" and run.terminal_reason == "final_answer", run.error
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))  # no event twice, none lost


def test_a_create_that_lost_a_deadlock_answers_a_retryable_503_that_does_not_say_the_database_is_down(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    def deadlocks(**kwargs: Any) -> Any:
        raise _deadlock()

    monkeypatch.setattr(acceptance, "accept_run", deadlocks)
    answer = client_for(world.raw_key).post("/api/v1/runs", {"agent": "order-assistant", "input": "hi"}, format="json")
    assert answer.status_code == 503 and answer.headers["Retry-After"]
    body = answer.json()
    assert "unavailable" not in body["detail"] and "conflict" in body["detail"], body
    assert body["error"]["code"] == "conflict_retry" and body["error"]["dependency"] is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not ON_POSTGRES, reason="row locks and concurrent transactions: PostgreSQL (CI runs this file there)")
def test_admitting_a_run_locks_its_tenant_without_blocking_other_commits_foreign_key_checks(world: World) -> None:
    """Admitting a run (the tenant's bound on running work) locks the tenant's row; a concurrent commit of rows that
    reference the tenant (an agent step's, checked at commit) must not wait for it. ``FOR UPDATE`` there made the step's
    commit queue behind the admitter while a flow held the chain head the admitter's peers waited for: the fault
    suite's last deadlocks (6 in 48 faults, 4 runs failed)."""
    from django.test.utils import CaptureQueriesContext

    from agents.models import Agent
    from tests.support.concurrency import other_transaction

    run_id = _agent_run(world)
    with CaptureQueriesContext(connection) as queries:
        assert services.admit(run_id, "token-a") is not None
    lock = next(q["sql"] for q in queries if '"tenants_tenant"' in q["sql"] and " FOR " in q["sql"])
    with other_transaction() as admitter:
        admitter.execute(lock)  # the admitter's lock, held
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            Agent.objects.create(tenant=world.tenant, slug="fk-check", name="fk check")  # checked at commit
        admitter.rollback()
    assert Agent.objects.filter(tenant=world.tenant, slug="fk-check").exists()
