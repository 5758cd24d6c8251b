"""``agents.services.start_run``'s writes: the new session's row and the run's, sent as one statement on PostgreSQL
(core/batch.py), with what a ``create()`` gave the caller; a repeated idempotency key still fails the insert."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from agents import services
from agents.models import Run, Session
from tenants.scoping import Actor
from tests.factories import make_world

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_new_session_and_its_run_are_written_as_a_create_would_write_them() -> None:
    world = make_world()
    actor = Actor(api_key=world.key, roles={world.tenant.pk: "operator"})
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        run = services.start_run(actor=actor, agent=world.agent, text="where is order O1?", enqueue=False,
                                 idempotency_key="k-1")
    inserts = [q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"].upper()]
    if connection.vendor == "postgresql":
        assert len(inserts) == 1 and "agents_session" in inserts[0] and "agents_run" in inserts[0]
    stored = Run.objects.get(pk=run.pk)
    assert (stored.tenant_id, stored.agent_id, stored.version_id, stored.session_id) == (
        world.tenant.pk, world.agent.pk, world.version.pk, run.session.pk)
    assert stored.input == "where is order O1?" and stored.api_key_id == world.key.pk and stored.status == "queued"
    assert stored.created_at == run.created_at and not run._state.adding
    assert Session.objects.get(pk=run.session.pk).tenant_id == world.tenant.pk


def test_a_second_run_with_the_same_key_fails_its_insert() -> None:
    world = make_world()
    actor = Actor(api_key=world.key, roles={world.tenant.pk: "operator"})
    services.start_run(actor=actor, agent=world.agent, text="one", enqueue=False, idempotency_key="k-2")
    with pytest.raises(IntegrityError), transaction.atomic():
        services.start_run(actor=actor, agent=world.agent, text="two", enqueue=False, idempotency_key="k-2")
    assert Run.objects.filter(idempotency_key="k-2").count() == 1
    assert Session.objects.filter(agent=world.agent).count() == 1  # the failed one's session went with it
