"""An inline flow's wave commits in ONE statement when it can (flows/commit.py ``complete_guarded``): decided from the
run and node rows the wave's own transaction left, its writes happen only if the run's row (and the tenant's audit
chain head, for audit rows) is still as that transaction left it, checked under their locks; the statement is sent in
a real transaction (``transaction.atomic()``), never with Django's connection state flipped. A decision that needs
more (counting the tenant's nodes for a fan-out) and a run another writer changed (a cancel, another run's audit
row) commit the locked way, which sees what changed. PostgreSQL only (elsewhere every wave locks first); outside a
test transaction, so each wave's commit is real."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agents import services
from agents.models import Run, RunEvent
from audit.chain import lock_head, verify_tenant, write_sealed
from audit.models import ToolCallAudit
from flows import commit, nodes, store
from flows.models import FlowNodeRun
from tests.db.test_flow_runs import ORDER, lookup, make_flow, start
from tests.factories import World, make_world

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement wave is PostgreSQL's (CI runs it)"),
]

#: a -> b -> (c, d) -> e: b's completion starts two nodes (a fan-out: the tenant's nodes are counted), c's and d's
#: one (a hand-over), e's none (the end)
GRAPH = {"inline": True, "max_parallel": 4,
         "nodes": [lookup("a"), lookup("b", ["a"]), lookup("c", ["b"]), lookup("d", ["b"]), lookup("e", ["c", "d"])]}


@pytest.fixture
def world() -> World:
    world = make_world()
    with transaction.atomic():
        lock_head(world.tenant.pk)  # a tenant with history has its chain head
    return world


def _execute(monkeypatch: pytest.MonkeyPatch, run_id: str, before: dict[str, Any] | None = None) -> list[str]:
    """Run the flow; returns how each commit of a completion went ("locked" or "guarded"), in order. ``before``: node
    id -> what to do (as another writer) while that node runs."""
    ways: list[str] = []
    real_lock, real_guarded, real_attempts = store.lock, commit.complete_guarded, nodes.attempts

    def lock(*args: Any, **kwargs: Any) -> Any:
        ways.append("locked")
        return real_lock(*args, **kwargs)

    def guarded(*args: Any, **kwargs: Any) -> Any:
        real_guarded(*args, **kwargs)
        ways.append("guarded")

    def attempts(run: Any, flow: Any, node: Any, row: Any, *args: Any, **kwargs: Any) -> Any:
        if before and row.node_id in before:
            before[row.node_id]()
        return real_attempts(run, flow, node, row, *args, **kwargs)

    monkeypatch.setattr(store, "lock", lock)
    monkeypatch.setattr(commit, "complete_guarded", guarded)
    monkeypatch.setattr(nodes, "attempts", attempts)
    services.execute_run(run_id)
    return ways


def _seqs_contiguous(run_id: str) -> None:
    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)) and Run.objects.get(pk=run_id).last_seq == len(seqs)


def test_a_wave_that_hands_its_places_on_commits_in_one_statement_and_a_fan_out_locks_first(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    make_flow(world, GRAPH, slug="guarded")
    run_id = start(world, {"flow": "guarded", "input": {"order_id": ORDER}}).json()["id"]
    with CaptureQueriesContext(connection) as queries:
        ways = _execute(monkeypatch, run_id)
    # a: the chain head is not known yet; b: starts two, counts under the tenant's lock (its guarded try sent nothing);
    # c and d (one wave): hand e their places; e: the end
    assert ways == ["locked", "locked", "guarded", "guarded"], ways
    sent = [q["sql"] for q in queries]
    guarded = [i for i, sql in enumerate(sent) if sql.startswith("WITH g AS (SELECT")]
    assert len(guarded) == 2
    # each in a real transaction of its own (transaction.atomic()): BEGIN before it, COMMIT after it
    around = [([s for s in sent[:i] if s in ("BEGIN", "COMMIT")][-1:], [s for s in sent[i + 1:] if s in ("BEGIN", "COMMIT")][:1])
              for i in guarded]
    assert around == [(["BEGIN"], ["COMMIT"])] * 2, around
    run = Run.objects.get(pk=run_id)
    assert run.terminal_reason == "final_answer" and run.lease_token == "", run.error
    assert sorted(FlowNodeRun.objects.filter(run_id=run_id, status="done", attempt=1).values_list("node_id", flat=True)) == [
        "a", "b", "c", "d", "e"]
    _seqs_contiguous(run_id)
    assert ToolCallAudit.objects.filter(run_id=run_id).count() == 5
    assert verify_tenant(world.tenant.pk) == (5, None)  # every row sealed in order after the one before


def test_a_guarded_wave_commits_in_a_real_transaction_that_nested_atomic_and_on_commit_see(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing flips Django's connection state (issue #51): inside the guarded commit autocommit is off, so a nested
    ``atomic()`` is a real savepoint and ``on_commit`` waits for a COMMIT that happens."""
    make_flow(world, GRAPH, slug="guarded")
    run_id = start(world, {"flow": "guarded", "input": {"order_id": ORDER}}).json()["id"]
    seen: list[tuple[bool, bool, bool]] = []
    committed: list[str] = []
    real = commit.complete_guarded

    def observed(*args: Any, **kwargs: Any) -> Any:
        with transaction.atomic():  # what a library's code does: a savepoint inside the wave's transaction
            seen.append((connection.in_atomic_block, connection.get_autocommit(), bool(connection.savepoint_ids)))
        transaction.on_commit(lambda: committed.append("wave"))
        return real(*args, **kwargs)

    monkeypatch.setattr(commit, "complete_guarded", observed)
    services.execute_run(run_id)
    assert seen and all(s == (True, False, True) for s in seen), seen
    assert len(committed) == 2, committed  # the two guarded waves' (the fan-out's try sent nothing: rolled back)
    assert Run.objects.get(pk=run_id).terminal_reason == "final_answer"
    _seqs_contiguous(run_id)


def test_another_runs_audit_row_between_waves_sends_the_wave_the_locked_way_and_the_chain_holds(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    make_flow(world, GRAPH, slug="guarded")
    run_id = start(world, {"flow": "guarded", "input": {"order_id": ORDER}}).json()["id"]
    other = Run.objects.get(pk=start(world, {"flow": "guarded", "input": {"order_id": ORDER}}).json()["id"])

    def other_run_writes() -> None:  # another run of the tenant seals a row: the chain head moves
        row = ToolCallAudit(tenant_id=world.tenant.pk, run_id=other.pk, agent_id=other.agent_id, version_id=other.version_id,
                            session_id=other.session_id, tool_name="query_order", call_id="other-1", status="ok", step=1)
        with transaction.atomic():
            write_sealed([type("Write", (), {"row": row, "started_pk": None})()], world.tenant.pk)

    ways = _execute(monkeypatch, run_id, {"c": other_run_writes})
    # c and d's wave tries the one statement, finds the head moved and writes nothing: locked; e then locks first too
    assert ways == ["locked", "locked", "locked", "locked"], ways
    assert Run.objects.get(pk=run_id).terminal_reason == "final_answer"
    _seqs_contiguous(run_id)
    assert ToolCallAudit.objects.filter(run_id=run_id).count() == 5
    assert verify_tenant(world.tenant.pk) == (6, None)


def test_a_cancel_requested_while_a_wave_runs_is_heard_by_its_commit(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    make_flow(world, GRAPH, slug="guarded")
    run_id = start(world, {"flow": "guarded", "input": {"order_id": ORDER}}).json()["id"]

    def cancel() -> None:  # what cancel_run does to a run a worker holds: the flag, for its next commit to hear
        Run.objects.filter(pk=run_id).update(cancel_requested=True)

    ways = _execute(monkeypatch, run_id, {"c": cancel})
    assert ways[-1] == "locked" and "guarded" not in ways[2:], ways
    run = Run.objects.get(pk=run_id)
    assert run.terminal_reason == "cancelled", (run.terminal_reason, run.error)
    assert not FlowNodeRun.objects.filter(run_id=run_id, node_id="e").exists()  # nothing started after the cancel
    _seqs_contiguous(run_id)
    assert verify_tenant(world.tenant.pk) == (ToolCallAudit.objects.filter(tenant_id=world.tenant.pk).count(), None)
