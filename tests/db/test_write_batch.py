"""config/batch.py: what a WriteBatch insert stores is what ``bulk_create`` stores, value for value.

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
from config.batch import WriteBatch, _json_insert
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
