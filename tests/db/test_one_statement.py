"""config/batch.py ``one_statement``: a block whose one write commits by itself (no BEGIN, no COMMIT), what it gives
``transaction.on_commit`` held until that write has committed and dropped when the block raises. An inline flow's
guarded wave commits this way (flows/runner.py ``_complete``). PostgreSQL and outside a test transaction, so what
another connection sees is what was committed."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from agents.models import Run, Session
from config.batch import one_statement
from tests.factories import World, make_world

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the guarded one-statement commit is PostgreSQL's (CI runs it)"),
]


@pytest.fixture
def run() -> Run:
    world: World = make_world()
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    return Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input="x")


def _step_elsewhere(run_id: object) -> int:
    """The run's step as another connection sees it: what has been committed."""
    settings = connection.settings_dict
    with psycopg.connect(host=settings["HOST"] or "127.0.0.1", port=settings["PORT"] or 5432, user=settings["USER"],
                         dbname=settings["NAME"], password=settings["PASSWORD"] or None) as other:
        row = other.execute("SELECT step FROM agents_run WHERE id = %s", [run_id]).fetchone()
        assert row is not None
        return int(row[0])


def test_the_write_commits_by_itself_and_the_hooks_run_after_it(run: Run) -> None:
    seen: list[str] = []
    with CaptureQueriesContext(connection) as queries, one_statement():
        transaction.on_commit(lambda: seen.append(f"first, step {_step_elsewhere(run.pk)}"))
        assert seen == []  # held: Django would have run it at once outside an atomic block
        Run.objects.filter(pk=run.pk).update(step=7)
        assert _step_elsewhere(run.pk) == 7  # committed already, before the block ends: no transaction around it
        transaction.on_commit(lambda: seen.append("second"))
        assert seen == []
    assert seen == ["first, step 7", "second"]  # after the write, in the order given
    sent = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    assert "BEGIN" not in sent and "COMMIT" not in sent, sent
    assert not connection.in_atomic_block and connection.get_autocommit()


def test_a_block_that_raises_drops_its_hooks_and_leaves_the_connection_usable(run: Run) -> None:
    seen: list[str] = []
    with pytest.raises(RuntimeError), one_statement():
        transaction.on_commit(lambda: seen.append("hook"))
        raise RuntimeError("the guard found the run changed")
    assert seen == [] and connection.run_on_commit == []
    assert not connection.in_atomic_block and not connection.needs_rollback
    transaction.on_commit(lambda: seen.append("after"))  # autocommit again: at once
    assert seen == ["after"]
    assert Run.objects.get(pk=run.pk).step == 0


def test_a_failed_statement_drops_the_hooks_and_writes_nothing(run: Run) -> None:
    seen: list[str] = []
    with pytest.raises(Exception), one_statement():  # noqa: B017 (the database's own error)
        transaction.on_commit(lambda: seen.append("hook"))
        with connection.cursor() as cursor:
            cursor.execute("UPDATE agents_run SET step = 5 WHERE id = %s AND 1 / 0 = 1", [run.pk])
    assert seen == [] and not connection.needs_rollback
    assert Run.objects.get(pk=run.pk).step == 0 == _step_elsewhere(run.pk)


def test_a_second_write_is_refused_before_it_is_sent(run: Run) -> None:
    seen: list[str] = []
    with pytest.raises(TransactionManagementError, match="second write"), one_statement():
        transaction.on_commit(lambda: seen.append("hook"))
        Run.objects.filter(pk=run.pk).update(step=1)
        Run.objects.get(pk=run.pk)  # reads are fine
        Run.objects.filter(pk=run.pk).update(step=2)
    assert _step_elsewhere(run.pk) == 1 and seen == []


def test_it_refuses_to_run_inside_a_transaction(run: Run) -> None:
    with transaction.atomic(), pytest.raises(TransactionManagementError, match="autocommit"), one_statement():
        pass
