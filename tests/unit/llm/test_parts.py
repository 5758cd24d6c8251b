from __future__ import annotations

import math

import pytest

from llm.breaker import CircuitBreaker
from llm.config import ModelInfo, ProviderConfig
from llm.errors import redact
from llm.openai_client import parse_retry_after
from llm.pricing import PriceTable
from llm.ratelimit import Bucket, LocalBucketStore


def test_buckets_are_taken_all_or_nothing() -> None:
    now = [0.0]
    store = LocalBucketStore(clock=lambda: now[0])
    roomy = Bucket("a", capacity=10, rate=1, amount=1)
    tight = Bucket("b", capacity=2, rate=1, amount=2)

    assert store.take([roomy, tight]) == (0.0, -1)
    wait, short = store.take([roomy, tight])
    assert (wait, short) == (2.0, 1)
    now[0] += 2
    assert store.take([roomy, tight]) == (0.0, -1)
    assert store.take([Bucket("c", capacity=1, rate=1, amount=5)])[0] == math.inf


def test_breaker_counts_consecutive_failures_only() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=2, cooldown_seconds=10, clock=lambda: now[0])
    breaker.record_failure("p")
    breaker.record_success("p")
    breaker.record_failure("p")
    assert breaker.state("p") == "closed"
    assert breaker.record_failure("p") is True
    assert breaker.allow("p")[0] is False
    now[0] = 10
    assert breaker.allow("p") == (True, 0.0)  # the single half-open probe
    assert breaker.allow("p")[0] is False
    assert breaker.record_failure("p") is True  # the probe failed: open again
    assert breaker.state("p") == "open"


def test_config_repr_hides_secrets() -> None:
    config = ProviderConfig("acme", base_url="http://x/v1", api_key="sk-very-secret-1234", default_headers={"X-Token": "tok-secret-99"})
    assert "sk-very-secret-1234" not in repr(config) and "tok-secret-99" not in str(config)
    assert "api_key=<set>" in repr(config) and "X-Token" in repr(config)
    with pytest.raises(ValueError, match="needs a base_url"):
        ProviderConfig("acme")
    with pytest.raises(ValueError, match="kind must be one of"):
        ProviderConfig("acme", kind="magic")  # type: ignore[arg-type]


def test_redact_removes_whole_and_partial_keys() -> None:
    key = "sk-abcdefgh12345678zyxwvuts"
    assert redact(f"bad key {key} / {key[:8]}… / …{key[-8:]}", [key]).count("[redacted]") == 3


def test_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert parse_retry_after({}) is None


def test_price_table() -> None:
    table = PriceTable([ProviderConfig("p", base_url="http://x", models={"m": ModelInfo(1000, 2.0, 8.0)})])
    assert table.cost("p/m", 1_000_000, 500_000) == 6.0
    assert table.cost("p/unknown", 10, 10) == 0.0
