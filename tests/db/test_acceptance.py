"""Issue #13, items 1 and 3: a run is accepted exactly once, and an outage is a 503, never a 500.

Item 1: ``POST /api/v1/runs`` honours ``Idempotency-Key`` per tenant (same body: the same run; another body: 422;
racing duplicates: one run), and a committed run is a 202 even when the broker refuses the enqueue (the sweeper
delivers it). Item 3: with the database or Redis down, the API, the console and ``/healthz`` answer 503 with
``Retry-After`` and say which dependency is down.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import IntegrityError, connection
from django.test import Client
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerDown
from rest_framework.test import APIClient

from agents import acceptance, services
from agents.models import Run, RunStatus, Session
from agents.sweeper import sweep_runs
from agents.tasks import execute_run_task
from tests.factories import World, make_world
from tests.support.clients import bearer_client

BODY = {"agent": "order-assistant", "input": "where is order O202411280001?"}


def _api(world: World) -> APIClient:
    return bearer_client(world.raw_key)


def _post(client: APIClient, body: dict[str, Any], key: str | None = None) -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post("/api/v1/runs", body, format="json", headers=headers)


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Runs handed to the broker (nothing executes them here)."""
    sent: list[str] = []
    monkeypatch.setattr(execute_run_task, "delay", lambda run_id: sent.append(run_id))
    return sent


# -- item 1: Idempotency-Key ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_same_key_and_body_twice_is_one_run_and_the_second_answer_says_it_replayed(enqueued: list[str]) -> None:
    world = make_world()
    client = _api(world)
    key = str(uuid.uuid4())
    first = _post(client, {**BODY, "facts": {"order": "O1", "b": [1, 2]}}, key)
    # a retry whose JSON has its keys in another order (and the same input, trimmed the same) is the same request
    second = _post(client, {"facts": {"b": [1, 2], "order": "O1"}, "input": f"  {BODY['input']} ", "agent": "order-assistant"},
                   key)
    assert first.status_code == 202 and "Idempotent-Replayed" not in first
    assert second.status_code == 202, second.content
    assert second["Idempotent-Replayed"] == "true"
    assert second.json()["id"] == first.json()["id"]
    assert Run.objects.filter(tenant=world.tenant).count() == 1
    run = Run.objects.get(pk=first.json()["id"])
    assert run.idempotency_key == key and len(run.request_digest) == 64
    # the stored digest is keyed: the body's plain hash is not it
    assert BODY["input"] not in run.request_digest


@pytest.mark.django_db
def test_the_same_key_with_a_different_body_is_a_422_naming_the_header(enqueued: list[str]) -> None:
    world = make_world()
    client = _api(world)
    assert _post(client, BODY, "order-42").status_code == 202
    for other in ({**BODY, "input": "cancel order O202411280001"}, {**BODY, "facts": {"order": "O2"}}):
        response = _post(client, other, "order-42")
        assert response.status_code == 422, response.content
        detail = response.json()["detail"]
        assert "Idempotency-Key" in detail and "differs from the first request" in detail
    assert Run.objects.filter(tenant=world.tenant).count() == 1


@pytest.mark.django_db
def test_keys_are_per_tenant_and_never_reveal_another_tenants_run(enqueued: list[str]) -> None:
    mine, theirs = make_world(), make_world()
    a = _post(_api(mine), BODY, "shared-key")
    b = _post(_api(theirs), {**BODY, "input": "something else entirely"}, "shared-key")
    assert (a.status_code, b.status_code) == (202, 202), b.content
    assert "Idempotent-Replayed" not in b
    assert a.json()["id"] != b.json()["id"]
    assert Run.objects.get(pk=b.json()["id"]).tenant_id == theirs.tenant.pk
    assert Run.objects.filter(idempotency_key="shared-key").count() == 2


@pytest.mark.django_db
def test_without_a_key_each_request_is_a_new_run(enqueued: list[str]) -> None:
    world = make_world()
    client = _api(world)
    assert _post(client, BODY).json()["id"] != _post(client, BODY).json()["id"]
    assert set(Run.objects.filter(tenant=world.tenant).values_list("idempotency_key", flat=True)) == {""}


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there", "new\nline"])
def test_a_key_that_is_not_1_to_255_printable_ascii_characters_is_a_400_saying_what_is_expected(
    key: str, enqueued: list[str]
) -> None:
    world = make_world()
    response = _post(_api(world), BODY, key)
    assert response.status_code == 400, response.content
    (message,) = response.json()["Idempotency-Key"]
    assert "1 to 255 printable ASCII characters" in message
    assert not Run.objects.filter(tenant=world.tenant).exists()


@pytest.mark.django_db
def test_the_longest_key_and_one_with_spaces_and_punctuation_are_accepted(enqueued: list[str]) -> None:
    world = make_world()
    for key in ("k" * 255, "order 42: retry #1 ~ {ok}"):
        assert _post(_api(world), BODY, key).status_code == 202
        assert _post(_api(world), BODY, key)["Idempotent-Replayed"] == "true"


@pytest.mark.django_db
def test_the_header_is_in_the_openapi_schema() -> None:
    schema = Client().get("/api/schema/", headers={"Accept": "application/json"}).json()
    create = schema["paths"]["/api/v1/runs"]["post"]
    (header,) = [p for p in create["parameters"] if p["name"] == "Idempotency-Key"]
    assert header["in"] == "header" and not header.get("required")
    assert "422" in create["responses"] and "Idempotent-Replayed" in create["responses"]["202"]["headers"]
    assert "Retry-After" in create["responses"]["503"]["headers"]
    assert "503" in schema["paths"]["/api/v1/runs"]["get"]["responses"]


def _race(world: World, body: dict[str, Any], key: str, monkeypatch: pytest.MonkeyPatch, lost: list[BaseException],
          threads: int = 2) -> list[Any]:
    """``threads`` requests with one key, all past the lookup for an earlier run before any of them creates one.

    ``lost`` receives what ``start_run`` raised in the requests that lost the race."""
    barrier = threading.Barrier(threads, timeout=20)
    looked = threading.local()
    earlier, start_run = acceptance._earlier, services.start_run

    def start(**kwargs: Any) -> Any:
        try:
            return start_run(**kwargs)
        except BaseException as exc:
            lost.append(exc)
            raise

    def in_step(*args: Any, **kwargs: Any) -> Any:
        found = earlier(*args, **kwargs)
        if not getattr(looked, "once", False):
            looked.once = True
            barrier.wait()  # every request has found no run with the key: now they all create one
        return found

    monkeypatch.setattr(acceptance, "_earlier", in_step)
    monkeypatch.setattr(services, "start_run", start)
    answers: list[Any] = [None] * threads

    def request(i: int) -> None:
        try:
            answers[i] = _post(_api(world), body, key)
        except BaseException as exc:  # reported below, not lost in the thread
            answers[i] = exc
        finally:
            connection.close()

    workers = [threading.Thread(target=request, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    return answers


@pytest.mark.django_db(transaction=True)  # each request commits on its own connection, as in production
def test_requests_racing_with_one_key_create_exactly_one_run(enqueued: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    lost: list[BaseException] = []
    answers = _race(world, BODY, "racing-key", monkeypatch, lost)
    assert [type(exc) for exc in lost] == [IntegrityError], "the loser's row hit the unique constraint"
    assert all(getattr(a, "status_code", None) == 202 for a in answers), answers
    assert len({a.json()["id"] for a in answers}) == 1
    assert sorted(a.get("Idempotent-Replayed", "") for a in answers) == ["", "true"]
    assert Run.objects.filter(tenant=world.tenant).count() == 1
    assert Session.objects.filter(tenant=world.tenant).count() == 1, "the loser's new session was rolled back with it"
    assert len(enqueued) == 1


@pytest.mark.django_db(transaction=True)
def test_requests_racing_with_one_key_on_one_session_create_exactly_one_run(
    enqueued: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world = make_world()
    first = _post(_api(world), BODY)
    Run.objects.filter(pk=first.json()["id"]).update(status=RunStatus.FINISHED)
    body = {**BODY, "input": "and the logistics?", "session": first.json()["session"]}
    lost: list[BaseException] = []
    answers = _race(world, body, "racing-on-a-session", monkeypatch, lost)
    assert [type(exc) for exc in lost] == [services.RunRefused], "the loser waited for the session, then found the run"
    assert all(getattr(a, "status_code", None) == 202 for a in answers), answers
    assert len({a.json()["id"] for a in answers}) == 1
    assert Run.objects.filter(tenant=world.tenant).count() == 2


# -- item 1: the run row is the outbox --------------------------------------------------------------------------------


@pytest.fixture
def broker_down(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[str]]]:
    """The broker refuses every publish until the returned function brings it back (then it records them)."""
    sent: list[str] = []

    def refuse(run_id: str) -> None:
        raise BrokerDown("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    monkeypatch.setattr(execute_run_task, "delay", refuse)

    def back() -> list[str]:
        monkeypatch.setattr(execute_run_task, "delay", lambda run_id: sent.append(run_id))
        return sent

    yield back


@pytest.mark.django_db(transaction=True)  # the enqueue happens on commit: a real one
def test_a_committed_run_is_a_202_when_the_broker_is_down_and_the_sweeper_delivers_it_later(
    broker_down: Callable[[], list[str]], caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    world = make_world()
    before = acceptance.ENQUEUE_FAILURES._value.get()
    with caplog.at_level(logging.WARNING, logger="agents.acceptance"):
        response = _post(_api(world), BODY, "after-an-outage")
    assert response.status_code == 202, response.content
    run_id = response.json()["id"]
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.QUEUED and not run.lease_token
    assert any(run_id in r.getMessage() and "not enqueued" in r.getMessage() for r in caplog.records), caplog.text
    assert acceptance.ENQUEUE_FAILURES._value.get() == before + 1
    # the client's retry (it may not have seen the 202) is the same run, not a second one
    assert _post(_api(world), BODY, "after-an-outage").json()["id"] == run_id
    # when the broker is back, the sweeper enqueues the run left queued
    sent = broker_down()
    assert run_id not in sweep_runs(now=timezone.now()).lost_enqueue, "not before SWEEP_QUEUED_AFTER_SECONDS"
    later = timezone.now() + dt.timedelta(seconds=settings.SWEEP_QUEUED_AFTER_SECONDS + 1)
    assert sweep_runs(now=later).lost_enqueue == [run_id]
    assert sent == [run_id]


@pytest.mark.django_db(transaction=True)
def test_an_unexpected_enqueue_error_is_logged_with_its_traceback_and_the_run_still_accepted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(run_id: str) -> None:
        raise RuntimeError("serializer bug")

    monkeypatch.setattr(execute_run_task, "delay", broken)
    world = make_world()
    with caplog.at_level(logging.WARNING, logger="agents.acceptance"):
        response = _post(_api(world), BODY)
    assert response.status_code == 202
    (record,) = [r for r in caplog.records if r.name == "agents.acceptance"]
    assert record.exc_info is not None and response.json()["id"] in record.getMessage()


# -- item 3: outages are 503s -----------------------------------------------------------------------------------------


def _database_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new query fails as the driver fails when PostgreSQL (or the SQLite file) is unreachable."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise connection.Database.OperationalError('connection to server at "127.0.0.1", port 1 failed: Connection refused')

    monkeypatch.setattr(connection, "create_cursor", refuse)


def _assert_unavailable(response: Any, dependency: str) -> None:
    assert response.status_code == 503, response.content[:300]
    assert int(response["Retry-After"]) > 0
    body = response.json()
    assert body["error"] == {"code": "dependency_unavailable", "dependency": dependency, "message": body["detail"], "field": None}
    assert "unavailable" in body["detail"]


@pytest.mark.django_db
def test_the_api_answers_503_with_retry_after_when_the_database_is_down(
    monkeypatch: pytest.MonkeyPatch, enqueued: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    world = make_world()
    client = _api(world)
    _database_down(monkeypatch)
    with caplog.at_level(logging.WARNING):
        _assert_unavailable(client.get("/api/v1/runs"), "database")
        _assert_unavailable(_post(client, BODY, "during-the-outage"), "database")
        _assert_unavailable(client.get(f"/api/v1/runs/{uuid.uuid4()}"), "database")
    assert not [r for r in caplog.records if r.exc_info], "an outage is one line in the log, not a traceback"
    monkeypatch.undo()
    assert _post(client, BODY, "during-the-outage").status_code == 202, "the retry after the outage starts the run"


@pytest.mark.django_db
def test_the_api_answers_503_when_redis_is_down_for_something_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    import redis.exceptions  # not at module level: importing redis loads the OpenTelemetry SDK

    world = make_world()

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    monkeypatch.setattr("agents.api.RunViewSet.list", refuse)
    _assert_unavailable(_api(world).get("/api/v1/runs"), "redis")


@pytest.mark.django_db
def test_with_redis_down_runs_are_still_accepted_and_rate_limits_count_in_the_process(
    monkeypatch: pytest.MonkeyPatch, broker_down: Callable[[], list[str]], settings: Any
) -> None:
    import redis.exceptions

    class DownStore:
        calls = 0

        def take(self, buckets: Any) -> Any:
            DownStore.calls += 1
            raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    from llm.ratelimit import LocalBucketStore
    from tenants import throttles

    monkeypatch.setattr(throttles, "bucket_store", DownStore)
    monkeypatch.setattr(throttles, "_redis_down_until", 0.0)
    monkeypatch.setattr(throttles, "_OUTAGE_STORE", LocalBucketStore())
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_THROTTLE_RATES": {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "run_create": "2/min"}}
    world = make_world()
    client = _api(world)
    assert _post(client, BODY).status_code == 202
    assert client.get("/api/v1/runs").status_code == 200
    assert DownStore.calls == 1, "Redis is tried once, then left alone for a few seconds"
    assert _post(client, BODY).status_code == 202
    refused = _post(client, BODY)
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0, "the limit still holds, per process"


@pytest.mark.django_db
def test_console_pages_answer_503_when_the_database_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    world = make_world()
    browser = Client()
    browser.force_login(world.operator)
    _database_down(monkeypatch)
    page = browser.get("/console/runs/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert page.status_code == 503 and int(page["Retry-After"]) > 0
    assert page["Content-Type"].startswith("text/html") and b"The database is unavailable" in page.content
    _assert_unavailable(browser.get("/console/runs/", headers={"Accept": "application/json"}), "database")


def _without_workers(down: list[str]) -> list[str]:
    return [name for name in down if name != "workers"]  # production mode here has no worker process


@pytest.mark.django_db
def test_healthz_names_the_database_when_it_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    _database_down(monkeypatch)
    response = Client().get("/healthz")
    assert response.status_code == 503 and int(response["Retry-After"]) > 0
    body = response.json()
    assert body["status"] == "unavailable" and _without_workers(body["down"]) == ["database"]
    assert "OperationalError" in body["checks"]["database"]["detail"]


@pytest.mark.django_db
def test_healthz_names_the_broker_and_channel_layer_when_redis_is_down(monkeypatch: pytest.MonkeyPatch) -> None:
    import redis.exceptions

    from config import health

    def refuse() -> str:
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    monkeypatch.setattr(health, "_broker", refuse)
    monkeypatch.setattr(health, "_channel_layer", refuse)
    response = Client().get("/healthz")
    assert response.status_code == 503 and _without_workers(response.json()["down"]) == ["broker", "channel_layer"]
    assert "ConnectionError" in response.json()["checks"]["broker"]["detail"]


def test_outages_are_told_from_other_errors_by_class_and_cause() -> None:
    import redis.exceptions
    from django.db import IntegrityError, InterfaceError, OperationalError

    from core.outages import dependency_down

    assert dependency_down(OperationalError("gone")) == dependency_down(InterfaceError("closed")) == "database"
    assert dependency_down(redis.exceptions.TimeoutError()) == "redis"
    assert dependency_down(redis.exceptions.BusyLoadingError()) == "redis"  # a subclass of ConnectionError
    assert dependency_down(BrokerDown("refused")) == "redis"
    wrapped = RuntimeError("publish failed")
    wrapped.__cause__ = redis.exceptions.ConnectionError("refused")
    assert dependency_down(wrapped) == "redis"
    assert dependency_down(IntegrityError("duplicate")) is None
    assert dependency_down(redis.exceptions.ResponseError("WRONGTYPE")) is None
    assert dependency_down(ValueError("x")) is None
