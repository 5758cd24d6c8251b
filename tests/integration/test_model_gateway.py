"""The model gateway end to end: live server + worker process(es) -> openai SDK -> a fake OpenAI-compatible server.

The fake servers run in this test process on 127.0.0.1; the worker processes reach them over HTTP,
with the providers configured as rows (and the default ``openai`` provider from the environment
the processes get). In production mode the stack has its own Redis database, so its workers are
the only ones taking its runs, and a second worker process checks the shared rate limit.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.core.management import call_command

from agents import provider_services
from agents.models import Agent, AgentVersion, Run, RunEvent
from audit.models import ConfigChange
from tenants.scoping import actor_for_user
from tests.factories import World, make_world
from tests.support.deployment import set_env
from tests.support.fake_openai import FakeOpenAI, server_error, text
from tests.support.live_stack import LiveStack, make_live_stack

pytestmark = pytest.mark.integration

KEY = "sk-live-gateway-key-0123456789abcdefXYZ"
WRONG_KEY = "sk-wrong-gateway-key-9876543210fedcbaQRS"
PRICE_IN, PRICE_OUT = 0.15, 0.6
PRICES = {"gpt-4o-mini": {"context_window": 128000, "price_in_per_1m": PRICE_IN, "price_out_per_1m": PRICE_OUT}}
DEMO_API_KEY = "aok_0badc0de_model-gateway-demo-key"


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeOpenAI]]:
    servers = {
        "main": FakeOpenAI(api_key=KEY, models=["gpt-4o-mini"], default={"kind": "planner"}),
        "failing": FakeOpenAI(api_key=KEY, default=server_error()),
        "limited": FakeOpenAI(api_key=KEY, default=text("done", delay=1.0)),  # slow: runs overlap across workers
    }
    for server in servers.values():
        server.start()
    yield servers
    for server in servers.values():
        server.stop()


def _own_redis_db(url: str) -> str:
    """The same Redis server, another database: this stack's broker queue is its own."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/13"))


@pytest.fixture(scope="module")
def stack(django_db_setup: Any, django_db_blocker: Any, fakes: dict[str, FakeOpenAI]) -> Iterator[LiveStack]:
    extra = {
        "OPENAI_BASE_URL": fakes["main"].base_url,
        "OPENAI_API_KEY": KEY,
        "OPENAI_MODEL": "gpt-4o-mini",
        "OPENAI_MODELS": json.dumps(PRICES),
        "PROVIDER_EGRESS_ALLOW": "127.0.0.1",  # the fake servers are on loopback, refused for tenants' providers otherwise
    }
    if os.environ.get("REDIS_URL"):
        extra["REDIS_URL"] = _own_redis_db(os.environ["REDIS_URL"])
    live = make_live_stack(extra)
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture(scope="module")
def world(stack: LiveStack, django_db_blocker: Any) -> World:
    with django_db_blocker.unblock():
        return make_world(model="openai/gpt-4o-mini")


def _provider(world: World, django_db_blocker: Any, name: str, base_url: str, **values: Any) -> Any:
    api_key = values.pop("api_key", KEY)
    with django_db_blocker.unblock():
        return provider_services.create_provider(
            actor=actor_for_user(world.operator), tenant=world.tenant, api_key=api_key,
            values={"name": name, "base_url": base_url, **values},
        )


def _agent(world: World, django_db_blocker: Any, model: str, policy: dict[str, Any] | None = None) -> str:
    slug = f"llm-{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        agent = Agent.objects.create(tenant=world.tenant, slug=slug, name=slug)
        version = AgentVersion.objects.create(
            tenant=world.tenant, agent=agent, number=1, model=model, system_prompt="You answer questions about orders.",
            tools=list(world.version.tools), policy={"limits": {"max_recursion": 6}, **(policy or {})},
        )
        agent.current_version = version
        agent.save(update_fields=["current_version"])
    return slug


def _start(stack: LiveStack, key: str, agent: str, text_: str = "where is order O202411280001?") -> str:
    with stack.client(key) as http:
        response = http.post("/api/v1/runs", json={"agent": agent, "input": text_})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _events(django_db_blocker: Any, run_id: str) -> list[RunEvent]:
    with django_db_blocker.unblock():
        return list(RunEvent.objects.filter(run_id=run_id).order_by("seq"))


def test_an_llm_agent_calls_tools_through_the_sdk_and_finishes(stack: LiveStack, world: World, fakes: Any,
                                                               django_db_blocker: Any) -> None:
    # given the default provider from OPENAI_BASE_URL, answering like the planner (tool calls, then text)
    before = len(fakes["main"].chat_requests)
    # when a run starts on openai/gpt-4o-mini
    run = stack.wait_for_run(world.raw_key, _start(stack, world.raw_key, "order-assistant"))
    # then it used the tools and answered
    assert run["terminal_reason"] == "final_answer", run
    assert "SF Express" in run["output"] or "SF1234567890" in run["output"], run["output"]
    events = _events(django_db_blocker, run["id"])
    calls = [e.payload for e in events if e.type == "model.call"]
    assert len(calls) >= 2 and {c["model"] for c in calls} == {"openai/gpt-4o-mini"}
    assert any(e.type == "tool.call" and e.payload["status"] == "ok" for e in events)
    requests = fakes["main"].chat_requests[before:]
    assert len(requests) == len(calls)
    assert all(r["headers"]["authorization"] == f"Bearer {KEY}" for r in requests)
    assert requests[0]["body"]["model"] == "gpt-4o-mini" and requests[0]["body"]["tools"]


def test_cost_per_run_is_the_sum_of_its_calls_by_the_price_table(stack: LiveStack, world: World, django_db_blocker: Any) -> None:
    run = stack.wait_for_run(world.raw_key, _start(stack, world.raw_key, "order-assistant", "what is in order O202411280002?"))
    assert run["terminal_reason"] == "final_answer", run
    calls = [e.payload for e in _events(django_db_blocker, run["id"]) if e.type == "model.call"]
    by_prices = sum(c["input_tokens"] * PRICE_IN / 1e6 + c["output_tokens"] * PRICE_OUT / 1e6 for c in calls)
    assert by_prices > 0
    assert sum(c["cost"] for c in calls) == pytest.approx(by_prices, abs=1e-9)
    assert run["usage"]["cost"] == pytest.approx(by_prices, abs=1e-9)
    assert run["usage"]["input_tokens"] == sum(c["input_tokens"] for c in calls)
    assert run["usage"]["output_tokens"] == sum(c["output_tokens"] for c in calls)


def test_a_500_fails_over_to_the_second_provider(stack: LiveStack, world: World, fakes: Any, django_db_blocker: Any) -> None:
    # given a primary that answers 500 and a backup, named as the version's fallback
    _provider(world, django_db_blocker, "primary", fakes["failing"].base_url, offered_models=PRICES)
    _provider(world, django_db_blocker, "backup", fakes["main"].base_url, offered_models=PRICES)
    agent = _agent(world, django_db_blocker, "primary/gpt-4o-mini", {"model": {"fallbacks": ["backup/gpt-4o-mini"]}})
    failing_before = len(fakes["failing"].chat_requests)
    # when a run starts
    run = stack.wait_for_run(world.raw_key, _start(stack, world.raw_key, agent))
    # then the backup answered, and the trace shows the primary's attempts (one retry) before it
    assert run["terminal_reason"] == "final_answer", run
    events = _events(django_db_blocker, run["id"])
    first_call = next(e for e in events if e.type == "model.call")
    attempts = [e.payload for e in events if e.type == "model.attempt" and e.parent_span_id == first_call.span_id]
    assert [(a["provider"], a["outcome"]) for a in attempts] == [
        ("primary", "server_error"), ("primary", "server_error"), ("backup", "ok"),
    ]
    assert attempts[0]["status_code"] == 500
    assert first_call.payload["model"] == "backup/gpt-4o-mini"
    assert len(fakes["failing"].chat_requests) - failing_before >= 2


@pytest.mark.parametrize(
    ("case", "expected_outcome", "expected_text"),
    [
        ("bad_key", "auth_error", "the API key for provider 'badkey' was refused (HTTP 401)"),
        ("bad_url", "connection_error", "could not connect to provider 'badurl'"),
        ("unknown_model", "unknown_model", "model 'gpt-nope' is not offered by provider 'nomodel'"),
    ],
)
def test_a_misconfigured_provider_ends_the_run_with_a_clear_error(
    stack: LiveStack, world: World, fakes: Any, django_db_blocker: Any, case: str, expected_outcome: str, expected_text: str,
) -> None:
    main = fakes["main"].base_url
    if case == "bad_key":
        _provider(world, django_db_blocker, "badkey", main, api_key=WRONG_KEY)
        model = "badkey/gpt-4o-mini"
    elif case == "bad_url":
        _provider(world, django_db_blocker, "badurl", "http://127.0.0.1:9/v1", max_retries=0)
        model = "badurl/gpt-4o-mini"
    else:
        _provider(world, django_db_blocker, "nomodel", main)
        model = "nomodel/gpt-nope"
    run = stack.wait_for_run(world.raw_key, _start(stack, world.raw_key, _agent(world, django_db_blocker, model)))
    assert run["terminal_reason"] == "error", run
    events = _events(django_db_blocker, run["id"])
    failure = next(e for e in events if e.type == "model.error")
    attempts = [e.payload for e in events if e.type == "model.attempt" and e.parent_span_id == failure.span_id]
    assert attempts and attempts[-1]["outcome"] == expected_outcome, attempts
    assert expected_text in failure.payload["error"] and expected_text in attempts[-1]["error"]
    finished = next(e for e in events if e.type == "run.finished")
    assert finished.payload["terminal_reason"] == "error" and expected_text in finished.payload["reason"]


def test_the_seeded_llm_agent_runs_on_the_default_provider(
    stack: LiveStack, django_db_blocker: Any, monkeypatch: Any, settings: Any,
) -> None:
    set_env(settings, "DEMO_API_KEY", DEMO_API_KEY)
    set_env(settings, "DEMO_PASSWORD", "demo-password-for-tests")
    set_env(settings, "OPENAI_MODEL", "gpt-4o-mini")
    with django_db_blocker.unblock(), open(os.devnull, "w") as sink:
        call_command("seed_demo", stdout=sink)
    run = stack.wait_for_run(DEMO_API_KEY, _start(stack, DEMO_API_KEY, "order-assistant-llm"))
    assert run["terminal_reason"] == "final_answer", run
    calls = [e.payload for e in _events(django_db_blocker, run["id"]) if e.type == "model.call"]
    assert calls and all(c["model"] == "openai/gpt-4o-mini" for c in calls)


def _wait_ready(stack: LiveStack, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = stack.logdir / f"{name}.log"
        if log.exists() and " ready." in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} did not become ready in {timeout}s; logs in {stack.logdir}")


def test_a_provider_rate_limit_holds_across_worker_processes(stack: LiveStack, world: World, fakes: Any,
                                                             django_db_blocker: Any) -> None:
    # given a provider allowing 3 requests a minute (a burst of 3, then one every 20 s), and in
    # production mode two worker processes sharing its bucket through Redis
    workers = ["worker"]
    if stack.mode == "production":
        stack.start_worker()
        workers.append("worker-2")
        for name in workers:
            _wait_ready(stack, name)
    name = f"limited-{uuid.uuid4().hex[:6]}"
    _provider(world, django_db_blocker, name, fakes["limited"].base_url, requests_per_minute=3)
    agent = _agent(world, django_db_blocker, f"{name}/gpt-4o-mini")
    before = len(fakes["limited"].chat_requests)
    started = time.monotonic()
    # when eight runs start at once
    ids = [_start(stack, world.raw_key, agent, "hello") for _ in range(8)]
    runs = [stack.wait_for_run(world.raw_key, run_id, timeout=60) for run_id in ids]
    elapsed = time.monotonic() - started
    # then no more requests reached the provider than its bucket allowed in that time
    reached = len(fakes["limited"].chat_requests) - before
    allowed = 3 + int(elapsed / 20)
    ok = [r for r in runs if r["terminal_reason"] == "final_answer"]
    refused = [r for r in runs if r["terminal_reason"] == "error"]
    assert 3 <= reached <= allowed, (reached, allowed, elapsed)
    assert len(ok) == reached and len(ok) + len(refused) == 8
    for run in refused:
        finished = next(e for e in _events(django_db_blocker, run["id"]) if e.type == "run.finished")
        assert "refused by the rate limit on provider" in finished.payload["reason"], finished.payload
    if stack.mode == "production":
        with django_db_blocker.unblock():
            executed = {str(pk) for pk in Run.objects.filter(pk__in=ids).values_list("pk", flat=True)}
        logs = {w: (stack.logdir / f"{w}.log").read_text(errors="replace") for w in workers}
        limited_url = f"{fakes['limited'].base_url}/chat/completions"
        # a refused run logs its id ("model call failed for run ..."); a call that went out logs its request
        served = {w: sum(1 for run_id in executed if run_id in text_) + text_.count(limited_url) for w, text_ in logs.items()}
        assert all(count >= 1 for count in served.values()), served  # both processes took runs


def test_no_provider_key_appears_in_logs_events_or_api_output(stack: LiveStack, world: World, django_db_blocker: Any) -> None:
    secrets = [KEY, WRONG_KEY]
    # the processes' logs
    for log in stack.logdir.glob("*.log"):
        content = log.read_text(errors="replace")
        for secret in secrets:
            assert secret not in content, f"a provider key is in {log}"
    # every event payload and audit row
    with django_db_blocker.unblock():
        payloads = json.dumps([e.payload for e in RunEvent.objects.filter(tenant=world.tenant)])
        audits = json.dumps([c.details for c in ConfigChange.objects.filter(tenant=world.tenant)])
        run_ids = [str(pk) for pk in Run.objects.filter(tenant=world.tenant).values_list("pk", flat=True)]
    assert "model.attempt" in payloads and len(run_ids) >= 5
    for secret in secrets:
        assert secret not in payloads and secret not in audits
    # the API: providers, runs and their events
    with stack.client(world.raw_key) as http:
        bodies = [http.get("/api/v1/providers").text]
        bodies += [http.get(f"/api/v1/runs/{run_id}").text for run_id in run_ids]
        bodies += [http.get(f"/api/v1/runs/{run_id}/events?limit=500").text for run_id in run_ids]
    assert '"api_key_status"' in bodies[0]
    for body in bodies:
        for secret in secrets:
            assert secret not in body
