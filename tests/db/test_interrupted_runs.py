"""Issue #50: a run whose database (or Redis) failed under it is interrupted, not failed. PostgreSQL restarting mid-step
ended accepted runs as ``error: internal error: OperationalError``, never retried. Now the worker keeps the run's
lease and lets it run out at once: the sweeper's next pass re-enqueues the run, taking it again counts a crash, and
it resumes from its last committed step. A run that keeps being interrupted ends as a crash loop, never forever; an
error of the run's own still ends it as ``error``."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from agents import engine, services
from agents.models import Run, RunStatus
from agents.sweeper import sweep_runs
from tenants.scoping import Actor
from tests.factories import make_world

pytestmark = pytest.mark.django_db


class _Broken:
    """A loop that fails as a step fails when the database went away under it (Django's error from the driver's)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def run(self, run_id: str) -> None:
        raise self.error


def _database_gone() -> Exception:
    try:
        raise connection.Database.OperationalError("server closed the connection unexpectedly")
    except Exception as driver:
        wrapped = OperationalError(str(driver))
        wrapped.__cause__ = driver
        return wrapped


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> Any:
    world = make_world()
    monkeypatch.setattr("agents.acceptance.deliver", lambda run_id: None)  # the test runs the task itself
    return services.start_run(actor=Actor(api_key=world.key), agent=world.agent, text="where is order O202411280001?")


def _sweep(monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> list[str]:
    sent: list[str] = []
    monkeypatch.setattr("agents.tasks.execute_run_task.delay", lambda run_id: sent.append(run_id))
    with django_capture_on_commit_callbacks(execute=True):
        sweep_runs(timezone.now())
    return sent


def test_a_run_whose_database_went_away_is_resumed_not_failed(
        queued: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    real = engine.build_loop
    monkeypatch.setattr(engine, "build_loop", lambda run, token: _Broken(_database_gone()))
    services.execute_run(str(queued.pk))

    run = Run.objects.get(pk=queued.pk)
    assert run.status == RunStatus.RUNNING and run.terminal_reason == "" and run.error == ""
    assert run.lease_token and run.lease_expires_at <= timezone.now()  # kept, and already run out

    assert _sweep(monkeypatch, django_capture_on_commit_callbacks) == [str(queued.pk)]
    monkeypatch.setattr(engine, "build_loop", real)
    services.execute_run(str(queued.pk))
    run.refresh_from_db()
    assert (run.status, run.terminal_reason, run.crash_count) == (RunStatus.FINISHED, "final_answer", 1)
    assert "O202411280001" in run.output


def test_a_run_interrupted_again_and_again_ends_as_a_crash_loop(
        queued: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    monkeypatch.setattr(engine, "build_loop", lambda run, token: _Broken(_database_gone()))
    for _ in range(services.MAX_CRASHES + 1):
        services.execute_run(str(queued.pk))
        _sweep(monkeypatch, django_capture_on_commit_callbacks)
    run = Run.objects.get(pk=queued.pk)
    assert (run.status, run.terminal_reason) == (RunStatus.FINISHED, "error")
    assert run.error.startswith("crash_loop") and run.needs_attention


def test_an_error_of_the_run_s_own_still_ends_it(queued: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "build_loop", lambda run, token: _Broken(ValueError("a bug")))
    services.execute_run(str(queued.pk))
    run = Run.objects.get(pk=queued.pk)
    assert (run.status, run.terminal_reason, run.error) == (RunStatus.FINISHED, "error", "internal error: ValueError")
    assert not run.lease_token


def test_a_flow_node_whose_database_went_away_starts_again_and_does_not_fail_the_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's row keeps its lease (not ``failed: internal error: OperationalError``); once the lease runs out the
    run's next advance starts the node again and the flow finishes; an error of the node's own still fails it."""
    import datetime as dt

    from flows import nodes
    from flows.models import FlowNodeRun
    from flows.runner import execute_node
    from tests.db.test_flow_runs import ORDER, drain, in_flight, lookup, make_flow, start

    world = make_world()
    make_flow(world, {"nodes": [lookup("a")]})
    run_id = start(world, {"flow": "desk", "input": {"order_id": ORDER}}).json()["id"]
    services.execute_run(run_id)
    run = Run.objects.get(pk=run_id)
    (node, token), = in_flight(run)
    real = nodes.tool.run

    def gone(*args: Any, **kwargs: Any) -> Any:
        raise _database_gone()

    monkeypatch.setattr(nodes.tool, "run", gone)
    with pytest.raises(OperationalError):
        execute_node(run_id, node, token)
    row = FlowNodeRun.objects.get(run=run, node_id="a")
    assert (row.status, row.lease_token, row.error) == ("running", token, "")

    monkeypatch.setattr(nodes.tool, "run", real)
    FlowNodeRun.objects.filter(pk=row.pk).update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    services.execute_run(run_id)  # the sweeper re-enqueues the run: its advance starts the node again
    drain(run)
    assert run.terminal_reason == "final_answer", run.error
    assert FlowNodeRun.objects.get(run=run, node_id="a").attempt == 2
