"""A step's trace rows: how agents/store.py builds RunEvent objects, and what holds their references.

``event_rows`` makes a dozen RunEvent objects a step through ``RunEvent(...)`` (its signals included). The trace
tables' ``run`` and ``tenant`` are not database foreign keys (agents/models.py ``_TRACE_REFERENCE``): deleting a run
through the ORM must still delete its events and messages.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db.models import signals

from agents.models import Run, RunEvent, RunMessage, Session
from agents.store import event_rows
from runtime.types import Event
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def run() -> Run:
    world: World = make_world()
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    return Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session, input="hi")


def _events() -> list[Event]:
    return [Event(type="model.call", payload={"model": "m", "api_key": "sk-secret-value-123"}, span_id="a" * 16, at=time.time()),
            Event(type="tool.call", payload={"tool": "echo"}, span_id="b" * 16, parent_span_id="a" * 16, at=time.time())]


def _fields(event: RunEvent) -> dict[str, Any]:
    return {f.attname: getattr(event, f.attname) for f in RunEvent._meta.concrete_fields}


def test_event_rows_are_what_the_models_constructor_makes(run: Run) -> None:
    rows = event_rows(run, 5, 2, _events())
    assert [r.seq for r in rows] == [5, 6] and {r.step for r in rows} == {2}
    assert rows[0].payload["api_key"] != "sk-secret-value-123"  # masked on the way in
    for row in rows:
        rebuilt = RunEvent(*[getattr(row, f.attname) for f in RunEvent._meta.concrete_fields])
        assert _fields(row) == _fields(rebuilt)
        assert (row._state.adding, row._state.db) == (True, None)
        assert row.run_id == run.pk and row.tenant_id == run.tenant_id and row.pk is None
    RunEvent.objects.bulk_create(rows)
    assert [(e.seq, e.type) for e in RunEvent.objects.filter(run=run)] == [(5, "model.call"), (6, "tool.call")]


def test_with_a_receiver_listening_event_rows_go_through_the_constructor(run: Run) -> None:
    seen: list[RunEvent] = []

    def receiver(sender: Any, instance: RunEvent, **_: Any) -> None:
        seen.append(instance)

    signals.post_init.connect(receiver, sender=RunEvent)
    try:
        rows = event_rows(run, 1, 1, _events())
    finally:
        signals.post_init.disconnect(receiver, sender=RunEvent)
    assert seen == rows and len(seen) == 2


def test_deleting_a_run_through_the_orm_deletes_its_trace(run: Run) -> None:
    RunEvent.objects.bulk_create(event_rows(run, 1, 1, _events()))
    RunMessage.objects.create(tenant_id=run.tenant_id, run=run, index=0, step=1, message={"role": "user", "content": "hi"})
    other = Run.objects.create(tenant=run.tenant, agent=run.agent, version=run.version, session=run.session, input="x")
    RunEvent.objects.bulk_create(event_rows(other, 1, 1, _events()))
    Run.objects.filter(pk=run.pk).delete()
    assert not RunEvent.objects.filter(run_id=run.pk).exists() and not RunMessage.objects.filter(run_id=run.pk).exists()
    assert RunEvent.objects.filter(run_id=other.pk).count() == 2  # another run's trace stays
