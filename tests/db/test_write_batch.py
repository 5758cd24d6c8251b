"""core/batch.py: what a WriteBatch insert stores is what ``bulk_create`` stores, value for value.

On PostgreSQL an insert is one statement with the rows as one JSON parameter, read back into each column by the
server (``jsonb_populate_recordset``); on SQLite it is ``bulk_create``. Both databases run these tests (CI runs the
database suite on PostgreSQL), so the awkward values below are checked against the JSON form there.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import Run, RunEvent, RunStatus, Session
from core.batch import WriteBatch, _json_insert
from releases.models import ReplayBatch
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db

AWKWARD_TEXT = "quote ' double \" backslash \\ %s %(x)s newline\n tab\t 中文 emoji \U0001f600 '); DROP TABLE x; --"
DOCUMENT = {
    "text": AWKWARD_TEXT,
    "nothing": None,
    "float": 0.1,
    "big": 2**62,
    "negative": -3.5e-7,
    "flag": False,
    "list": [1, "two", None, {"three": [3]}],
    "empty": {},
    "unicode key 键": "value",
}


@pytest.fixture
def world() -> World:
    return make_world()


def _run(world: World) -> Run:
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    return Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input="hello")


def _events(run: Run, first_seq: int, at: dt.datetime) -> list[RunEvent]:
    return [
        RunEvent(tenant_id=run.tenant_id, run_id=run.pk, seq=first_seq, step=2.0, type="tool.finished",  # a float step
                 span_id="s" * 16, parent_span_id="", payload=DOCUMENT, at=at),
        RunEvent(tenant_id=run.tenant_id, run_id=str(run.pk), seq=first_seq + 1, step=True, type=RunStatus.RUNNING,
                 span_id="", parent_span_id=AWKWARD_TEXT[:32], payload="a string document", at=at),
        RunEvent(tenant_id=run.tenant_id, run_id=run.pk, seq=first_seq + 2, step=0, type="t", payload=[None, 1.5], at=at),
    ]


def _stored(run: Run, seqs: range) -> list[dict[str, Any]]:
    fields = ("seq", "step", "type", "span_id", "parent_span_id", "payload", "at", "tenant_id", "run_id")
    return list(RunEvent.objects.filter(run=run, seq__in=seqs).order_by("seq").values(*fields))


def test_an_insert_stores_what_bulk_create_stores_for_awkward_values(world: World) -> None:
    run = _run(world)
    # A time with microseconds in a zone that is not UTC: stored as the same instant.
    at = dt.datetime(2026, 12, 5, 17, 30, 1, 123456, tzinfo=dt.timezone(dt.timedelta(hours=8)))
    RunEvent.objects.bulk_create(_events(run, 1, at))
    batch = WriteBatch()
    batch.insert(RunEvent, _events(run, 11, at))
    batch.execute()

    expected, got = _stored(run, range(1, 4)), _stored(run, range(11, 14))
    assert len(got) == 3
    for want, have in zip(expected, got, strict=True):
        assert have == {**want, "seq": want["seq"] + 10}
    assert got[0]["payload"] == DOCUMENT and got[0]["step"] == 2 and got[1]["step"] == 1
    assert got[1]["type"] == "running" and got[1]["payload"] == "a string document"
    assert got[0]["at"] == at


def test_defaults_pre_save_and_uuid_keys_are_applied_as_bulk_create_applies_them(world: World) -> None:
    before = timezone.now()
    session = Session(tenant=world.tenant, agent=world.agent, facts={"order": "O1"})  # id, usage: defaults; times: auto_now
    batch = WriteBatch()
    batch.insert(Session, [session])
    batch.execute()
    stored = Session.objects.get(pk=session.pk)
    assert isinstance(session.pk, uuid.UUID) and stored.agent_id == world.agent.pk
    assert stored.facts == {"order": "O1"} and stored.usage == {} and stored.turns == 0
    assert stored.created_at >= before and stored.updated_at >= before
    assert stored.api_key_id is None and stored.erased_at is None  # a null foreign key and a null time


def test_on_postgresql_an_insert_is_one_statement_whatever_the_row_count(world: World) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the JSON form is PostgreSQL's; SQLite runs bulk_create (the tests above)")
    run = _run(world)
    now = timezone.now()
    statements = []
    for first, count in ((1, 1), (100, 50)):
        batch = WriteBatch()
        batch.insert(RunEvent, [RunEvent(tenant_id=run.tenant_id, run_id=run.pk, seq=first + i, step=1, type="t", at=now)
                                for i in range(count)])
        [(sql, params)] = batch._parts
        assert "jsonb_populate_recordset" in sql and len(params) == 1  # the rows: one JSON parameter
        statements.append(sql)
        with CaptureQueriesContext(connection) as queries:
            batch.execute()
        assert len(queries.captured_queries) == 1
    # The same text for one row and fifty: PostgreSQL prepares it once.
    assert statements[0] == statements[1]
    assert RunEvent.objects.filter(run=run).count() == 51


def test_a_model_the_json_form_cannot_carry_goes_through_djangos_compiler() -> None:
    # A decimal field would lose its exactness through a JSON number: ReplayBatch keeps Django's UNNEST insert.
    assert _json_insert(ReplayBatch, False, "default") is None
    assert _json_insert(RunEvent, False, "default") is not None


def test_update_where_sets_each_matched_row_its_own_values_and_leaves_the_rest(world: World) -> None:
    run = _run(world)
    at = timezone.now()
    Run.objects.filter(pk=run.pk).update(started_at=at)
    RunEvent.objects.bulk_create(_events(run, 1, at))
    later = at + dt.timedelta(minutes=5)
    batch = WriteBatch()
    batch.update_where(RunEvent, {"run_id": run.pk, "seq": 1, "type": "tool.finished"}, payload=DOCUMENT, step=7.0, at=later)
    batch.update_where(RunEvent, {"run_id": str(run.pk), "seq": 2, "type": "running"}, payload=[], step=True, at=later)
    batch.update_where(RunEvent, {"run_id": run.pk, "seq": 3, "type": "not its type"}, payload={"changed": 1}, step=9, at=later)
    if connection.vendor == "postgresql":
        [((_, matched, values), rows)] = batch._rows.values()  # one shape: one part for the three rows
        assert len(rows) == 3 and len(matched) == 3 and len(values) == 3
    batch.update_where(Run, {"id": run.pk}, output=AWKWARD_TEXT, status=RunStatus.FINISHED,
                       started_at=None, finished_at=later)
    batch.execute()

    got = _stored(run, range(1, 4))
    assert (got[0]["payload"], got[0]["step"], got[0]["at"]) == (DOCUMENT, 7, later)
    assert (got[1]["payload"], got[1]["step"], got[1]["at"]) == ([], 1, later)
    assert (got[2]["payload"], got[2]["step"], got[2]["at"]) == ([None, 1.5], 0, at)  # not matched: unchanged
    run.refresh_from_db()
    assert run.output == AWKWARD_TEXT and run.status == RunStatus.FINISHED
    assert run.started_at is None and run.finished_at == later  # None sets SQL NULL


def test_update_where_falls_back_to_the_orm_for_expressions_and_null_matches(world: World) -> None:
    from django.db.models import F

    run = _run(world)
    RunEvent.objects.bulk_create(_events(run, 1, timezone.now()))
    batch = WriteBatch()
    batch.update_where(RunEvent, {"run_id": run.pk, "seq": 1}, step=F("step") + 10)  # an expression
    batch.update_where(Session, {"id": run.session_id, "api_key_id": None}, turns=4)  # IS NULL, not "= NULL"
    assert not batch._rows
    batch.execute()
    assert RunEvent.objects.get(run=run, seq=1).step == 12
    assert Session.objects.get(pk=run.session_id).turns == 4


def test_a_one_row_update_looks_its_row_up_by_index_and_many_rows_share_one_text(world: World) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the JSON form is PostgreSQL's; SQLite runs the ORM's update")
    runs = [_run(world) for _ in range(3)]
    # Enough runs that a scan of the table costs more than an index lookup, with fresh statistics.
    session = runs[0].session
    Run.objects.bulk_create(Run(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input=f"r{i}")
                            for i in range(2000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agents_run")
    one = WriteBatch()
    one.update_where(Run, {"id": runs[0].pk}, output="one")
    [(sql, params, _)] = one._take()
    # One object, not an array of one: the planner counts one row (a set-returning function counts for 100 and
    # the update joined them by reading every run of the table, a step's commit growing with the run table).
    assert "jsonb_to_record(" in sql and "jsonb_to_recordset(" not in sql
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Scan using agents_run_pkey" in plan and "Seq Scan on agents_run" not in plan, plan

    many = WriteBatch()
    many.update_where(Run, {"id": runs[1].pk}, output="two")
    many.update_where(Run, {"id": runs[2].pk}, output="three")
    [(sql_many, _, _)] = many._take()
    assert "jsonb_to_recordset(" in sql_many

    for batch, outputs in ((one, ["one"]), (many, ["two", "three"])):
        batch.update_where(Run, {"id": runs[0].pk}, output=outputs[0])
        if len(outputs) > 1:
            batch.update_where(Run, {"id": runs[1].pk}, output=outputs[1])
        batch.execute()
    assert [Run.objects.get(pk=r.pk).output for r in runs[:2]] == ["two", "three"]
    assert Run.objects.get(pk=runs[2].pk).output == ""


def test_a_rows_values_are_read_from_the_instance_and_auto_now_still_applies(world: World) -> None:
    from core.batch import _plain_save

    assert _plain_save(RunEvent._meta.get_field("at"))  # a DateTimeField without auto_now: read as it is
    assert not _plain_save(Session._meta.get_field("updated_at"))  # auto_now: pre_save decides, as bulk_create
    run = _run(world)
    RunEvent.objects.bulk_create(_events(run, 1, timezone.now()))
    whole = RunEvent.objects.get(run=run, seq=1)
    partial = RunEvent.objects.only("seq").get(pk=whole.pk)
    assert "payload" not in partial.__dict__
    plan = _json_insert(RunEvent, True, "default")
    if plan is None:
        pytest.skip("the JSON form is PostgreSQL's")
    _, row = plan
    # A deferred field is read as Django reads it (a query), not a KeyError: the same row as the whole object's.
    assert row(partial) == row(whole)
    assert row(whole)["payload"] == DOCUMENT and row(whole)["run_id"] == str(run.pk)


def test_an_orm_write_in_a_batch_waits_for_execute_and_keeps_the_batch_unguarded(world: World) -> None:
    """A write the joined statement cannot hold (a queryset's update) runs through the ORM when the batch executes,
    with the rest; a guarded statement cannot carry it (issue #51: no SQL taken from Django's query internals)."""
    run = _run(world)
    batch = WriteBatch()
    batch.update(Run.objects.filter(pk=run.pk), error="set by the batch")
    batch.insert(RunEvent, _events(run, 1, timezone.now()))
    if connection.vendor == "postgresql":  # elsewhere each part runs at once, as the ORM would
        assert Run.objects.get(pk=run.pk).error == "" and not RunEvent.objects.filter(run=run).exists()
        assert not batch.can_guard()
    batch.execute()
    assert Run.objects.get(pk=run.pk).error == "set by the batch"
    assert RunEvent.objects.filter(run=run).count() == 3
    assert len(batch) == 0
