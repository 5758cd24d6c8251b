"""The gateway in front of real HTTP providers (the fake server), through the real openai SDK."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator

import pytest

from llm.config import GatewayConfig, ModelInfo, ProviderConfig, RateLimit
from llm.errors import (
    AllRoutesFailedError,
    ModelError,
    ProviderAuthError,
    ProviderTimeoutError,
    RateLimitExceededError,
)
from llm.gateway import ModelGateway
from llm.ratelimit import RedisBucketStore
from runtime.types import ModelRequest, ToolSpec
from tests.support.fake_openai import FakeOpenAI, error, hang, rate_limited, server_error, text

KEY = "sk-fake-provider-key-0123456789"
BACKUP_KEY = "sk-backup-provider-key-987654321"
PRICES = ModelInfo(context_window=128_000, price_in_per_1m=0.15, price_out_per_1m=0.60)


def primary(server: FakeOpenAI, **kw) -> ProviderConfig:
    settings = {"base_url": server.base_url, "api_key": KEY, "timeout": 5.0, "models": {"small": PRICES}}
    return ProviderConfig("acme", **{**settings, **kw})


def secondary(server: FakeOpenAI, **kw) -> ProviderConfig:
    settings = {"base_url": server.base_url, "api_key": BACKUP_KEY, "timeout": 5.0, "models": {"small": ModelInfo()}}
    return ProviderConfig("backup", **{**settings, **kw})


def ask(model: str = "acme/small", tools: list[ToolSpec] | None = None, **metadata) -> ModelRequest:
    return ModelRequest(model, [{"role": "user", "content": "where is order O202411280001?"}], tools or [], metadata=metadata)


def attempts(trace: list[dict]) -> list[tuple[str, str]]:
    return [(t["target"], t["outcome"]) for t in trace if t["type"] == "model.attempt"]


class Sleeps:
    """Records requested sleeps and really sleeps (so Retry-After is honoured on the wire)."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        time.sleep(seconds)


def test_429_then_success_honours_retry_after(fake: FakeOpenAI) -> None:
    fake.script(rate_limited(retry_after=0.3), text("after the wait"))
    sleeps = Sleeps()
    gateway = ModelGateway([primary(fake)], sleep=sleeps)

    response = gateway.complete(ask())

    assert response.content == "after the wait" and response.model == "acme/small"
    assert sleeps.calls == [0.3]
    first, second = fake.chat_requests
    assert second["at"] - first["at"] >= 0.3
    assert attempts(response.trace) == [("acme/small", "rate_limited"), ("acme/small", "ok")]
    limited = response.trace[0]
    assert limited["status_code"] == 429 and limited["retry_after"] == 0.3 and limited["attempt"] == 1
    assert set(limited) >= {"type", "provider", "model", "attempt", "outcome", "status_code", "latency_ms", "error"}


def test_retry_after_beyond_the_cap_fails_over_at_once(fake: FakeOpenAI, backup: FakeOpenAI) -> None:
    fake.script(rate_limited(retry_after=120))
    sleeps = Sleeps()
    config = GatewayConfig(fallbacks={"acme/small": ["backup/small"]}, retry_after_cap_seconds=5)
    response = ModelGateway([primary(fake), secondary(backup)], config, sleep=sleeps).complete(ask())
    assert response.model == "backup/small" and sleeps.calls == []


def test_500_is_retried_once_then_fails_over_to_the_next_provider(fake: FakeOpenAI, backup: FakeOpenAI) -> None:
    fake.set_default(server_error(500))
    backup.script(text("from the backup"))
    config = GatewayConfig(fallbacks={"acme/small": ["backup/small"]}, retry_backoff_seconds=0.01)
    gateway = ModelGateway([primary(fake), secondary(backup)], config)

    response = gateway.complete(ask())

    assert response.content == "from the backup" and response.model == "backup/small"
    assert attempts(response.trace) == [
        ("acme/small", "server_error"),
        ("acme/small", "server_error"),
        ("backup/small", "ok"),
    ]
    assert [t["attempt"] for t in response.trace] == [1, 2, 1]
    assert len(fake.chat_requests) == 2 and len(backup.chat_requests) == 1


def test_every_route_failing_says_why_for_each(fake: FakeOpenAI, backup: FakeOpenAI) -> None:
    fake.set_default(server_error(502))
    backup.set_default(error(400, "messages must not be empty"))
    config = GatewayConfig(fallbacks={"acme/small": ["backup/small"]}, retry_backoff_seconds=0.01)
    with pytest.raises(AllRoutesFailedError) as failed:
        ModelGateway([primary(fake), secondary(backup)], config).complete(ask())
    message = str(failed.value)
    assert "acme/small: provider 'acme' failed with HTTP 502" in message
    assert "backup/small: provider 'backup' rejected the request" in message
    assert attempts(failed.value.trace)[-1] == ("backup/small", "bad_request")


def test_circuit_breaker_opens_then_half_opens(fake: FakeOpenAI, backup: FakeOpenAI) -> None:
    now = [1000.0]
    fake.set_default(server_error(500))
    config = GatewayConfig(
        fallbacks={"acme/small": ["backup/small"]},
        breaker_failure_threshold=2,
        breaker_cooldown_seconds=30,
        retry_backoff_seconds=0,
    )
    gateway = ModelGateway([primary(fake), secondary(backup)], config, clock=lambda: now[0], sleep=lambda s: None)

    gateway.complete(ask())  # two 500s on acme: the circuit opens
    assert gateway.breaker.state("acme") == "open"
    skipped = gateway.complete(ask())
    assert attempts(skipped.trace) == [("acme/small", "circuit_open"), ("backup/small", "ok")]
    assert "circuit is open" in skipped.trace[0]["error"]
    assert len(fake.chat_requests) == 2, "no request reaches a provider whose circuit is open"

    now[0] += 31  # after the cool-down one probe goes through; it succeeds and closes the circuit
    fake.set_default(text("recovered"))
    probe = gateway.complete(ask())
    assert probe.model == "acme/small" and gateway.breaker.state("acme") == "closed"


def test_timeout_on_a_hang_is_not_retried_and_fails_over(fake: FakeOpenAI, backup: FakeOpenAI) -> None:
    fake.script(hang(5))
    backup.script(text("fast answer"))
    config = GatewayConfig(fallbacks={"acme/small": ["backup/small"]})
    gateway = ModelGateway([primary(fake, timeout=0.4), secondary(backup)], config)

    started = time.monotonic()
    response = gateway.complete(ask())

    assert time.monotonic() - started < 2
    assert attempts(response.trace) == [("acme/small", "timeout"), ("backup/small", "ok")]
    with pytest.raises(ProviderTimeoutError, match=r"did not answer within 0\.4 s"):
        fake.script(hang(5))
        ModelGateway([primary(fake, timeout=0.4)]).complete(ask())


def test_local_rate_limit_waits_then_fails_with_a_clear_reason(fake: FakeOpenAI) -> None:
    # 120 requests a minute, a burst of one: the second call must wait half a second
    limited = primary(fake, rate_limit=RateLimit(requests_per_minute=120, burst_seconds=0.5))
    gateway = ModelGateway([limited], GatewayConfig(max_wait_seconds=1.0))
    gateway.complete(ask())
    started = time.monotonic()
    second = gateway.complete(ask())
    assert 0.35 <= time.monotonic() - started < 3.0  # it waited its turn (the upper bound only catches a hang)
    assert second.trace[0]["rate_limit_wait_ms"] >= 350

    impatient = ModelGateway([limited], GatewayConfig(max_wait_seconds=0.1))
    impatient.complete(ask())
    with pytest.raises(RateLimitExceededError) as refused:
        impatient.complete(ask())
    assert str(refused.value).startswith("a call to acme/small was refused by the rate limit on provider 'acme' requests per minute (120)")
    assert "calls wait at most 0.1 s" in str(refused.value)
    assert refused.value.trace[-1]["outcome"] == "rate_limit_wait_exceeded"


def test_tenant_token_limit_stops_without_failing_over(fake: FakeOpenAI, backup: FakeOpenAI) -> None:
    config = GatewayConfig(
        fallbacks={"acme/small": ["backup/small"]},
        tenant_rate_limits={"t-small": RateLimit(tokens_per_minute=5)},
    )
    with pytest.raises(RateLimitExceededError, match="tenant 't-small' tokens per minute") as refused:
        ModelGateway([primary(fake), secondary(backup)], config).complete(ask(tenant="t-small"))
    assert "more than the bucket can ever hold" in str(refused.value)
    assert fake.chat_requests == [] and backup.chat_requests == []


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    redis = pytest.importorskip("redis")
    client = redis.Redis(host="127.0.0.1", port=6379)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    prefix = f"test:llm:{uuid.uuid4().hex}:"
    yield prefix
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_redis_bucket_is_shared_by_two_gateways(fake: FakeOpenAI, redis_prefix: str) -> None:
    import redis

    # given two gateways as two worker processes would build them, sharing Redis
    limited = primary(fake, rate_limit=RateLimit(requests_per_minute=60, burst_seconds=1))
    config = GatewayConfig(max_wait_seconds=0.2)
    first = ModelGateway([limited], config, bucket_store=RedisBucketStore(redis.Redis(), prefix=redis_prefix))
    second = ModelGateway([limited], config, bucket_store=RedisBucketStore(redis.Redis(), prefix=redis_prefix))

    # when the first spends the only request of the burst, the second must wait (a second) and gives up
    first.complete(ask())
    with pytest.raises(RateLimitExceededError, match="provider 'acme' requests per minute"):
        second.complete(ask())
    assert len(fake.chat_requests) == 1
    assert redis.Redis().exists(f"{redis_prefix}provider:acme:requests")

    # and the bucket refills for both at the configured rate
    time.sleep(1.0)
    assert second.complete(ask()).content == "OK"


def test_cost_is_tokens_times_the_price_table(fake: FakeOpenAI) -> None:
    fake.script(text("priced", usage={"prompt_tokens": 12_000, "completion_tokens": 3_000}))
    response = ModelGateway([primary(fake)]).complete(ask())
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12_000, 3_000)
    assert response.usage.cost == pytest.approx(12_000 * 0.15 / 1e6 + 3_000 * 0.60 / 1e6)
    assert response.trace[-1]["cost"] == response.usage.cost


def test_task_class_routes_to_a_cheaper_model_and_the_planner_is_a_provider(fake: FakeOpenAI) -> None:
    demo = ProviderConfig("demo", kind="deterministic")
    config = GatewayConfig(task_models={"summarize": "demo/planner"})
    gateway = ModelGateway([primary(fake), demo], config)

    summary = gateway.complete(ModelRequest("acme/small", [{"role": "user", "content": "hello"}], [], task="summarize"))
    assert summary.model == "demo/planner" and summary.usage.cost == 0.0
    assert [t["type"] for t in summary.trace] == ["model.attempt", "planner.plan"]
    assert gateway.route(ModelRequest("acme/small", [], [], task="summarize")) == ["demo/planner", "acme/small"]
    assert fake.chat_requests == []


def test_the_provider_key_never_leaks(fake: FakeOpenAI, backup: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "sk-this-is-the-wrong-secret-key-42"
    # the backup echoes the key it was given in its error body; the gateway must scrub it
    backup.set_default(server_error(500, message=f"upstream said: bad key {BACKUP_KEY}"))
    providers = [primary(fake, api_key=wrong), secondary(backup)]
    gateway = ModelGateway(providers, GatewayConfig(fallbacks={"acme/small": ["backup/small"]}), sleep=lambda s: None)

    with pytest.raises(ModelError) as failed:
        gateway.complete(ask())

    assert isinstance(failed.value.errors[0], ProviderAuthError)  # type: ignore[attr-defined]
    texts = [str(failed.value), repr(failed.value), json.dumps(failed.value.trace), caplog.text]
    texts += [repr(p) for p in providers] + [repr(gateway), repr(gateway.client("acme"))]
    for secret in (wrong, BACKUP_KEY):
        for where in texts:
            assert secret not in where
            assert secret[-8:] not in where
    assert "[redacted]" in str(failed.value)


class Deltas:
    """A DeltaListener that records what each attempt was told, and when."""

    def __init__(self, fail: bool = False) -> None:
        self.pieces: list[tuple[int, str, float]] = []
        self.closed: list[int] = []
        self.fail = fail

    def open(self, request: ModelRequest, attempt: int) -> Deltas.Sink:
        return Deltas.Sink(self, attempt)

    class Sink:
        def __init__(self, owner: Deltas, attempt: int) -> None:
            self.owner, self.attempt = owner, attempt

        def write(self, text: str) -> None:
            if self.owner.fail:
                raise RuntimeError("listener bug")
            self.owner.pieces.append((self.attempt, text, time.monotonic()))

        def close(self) -> None:
            self.owner.closed.append(self.attempt)


def test_deltas_reach_the_listener_while_the_provider_streams_and_attempts_are_numbered(fake: FakeOpenAI,
                                                                                      backup: FakeOpenAI) -> None:
    # given a primary that fails (500, then 500 on its retry) and a backup that streams slowly
    fake.set_default(server_error(500))
    backup.script(text("the answer arrives in pieces", pieces=5, chunk_delay=0.1))
    config = GatewayConfig(fallbacks={"acme/small": ["backup/small"]}, retry_backoff_seconds=0.01)
    deltas = Deltas()
    # when the gateway is called with a listener (the providers' configs do not ask for streaming)
    response = ModelGateway([primary(fake), secondary(backup)], config).complete(ask(), deltas=deltas)
    done = time.monotonic()
    # then every attempt was opened and closed, and the backup's text came in pieces, before the reply was whole
    assert deltas.closed == [1, 2, 3]
    assert {a for a, _, _ in deltas.pieces} == {3} and len(deltas.pieces) == 5
    assert "".join(t for _, t, _ in deltas.pieces) == response.content == "the answer arrives in pieces"
    assert done - deltas.pieces[0][2] >= 0.3
    assert backup.chat_requests[-1]["body"]["stream"] is True


def test_a_failing_listener_never_fails_the_call(fake: FakeOpenAI) -> None:
    fake.script(text("still answered", pieces=3))
    response = ModelGateway([primary(fake)]).complete(ask(), deltas=Deltas(fail=True))
    assert response.content == "still answered"
