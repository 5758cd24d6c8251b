"""Plain configuration the Django layer fills from Provider rows (or the environment).

No secret is ever part of a ``repr``: operators paste these objects into logs and tickets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

ProviderKind = Literal["openai_compatible", "deterministic"]
PROVIDER_KINDS: tuple[str, ...] = ("openai_compatible", "deterministic")


@dataclass(frozen=True)
class ModelInfo:
    """What the gateway knows about one model of a provider. Prices are per 1M tokens."""

    context_window: int = 128_000
    price_in_per_1m: float = 0.0
    price_out_per_1m: float = 0.0


@dataclass(frozen=True)
class RateLimit:
    """A token bucket: ``requests_per_minute`` and/or ``tokens_per_minute``; ``None`` means unlimited.

    A bucket holds ``burst_seconds`` worth of its rate (by default one minute's worth, so a quiet
    minute allows a burst of that size), and never less than one request.
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    burst_seconds: float = 60.0

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None (unlimited), got {value!r}")
        if self.burst_seconds <= 0:
            raise ValueError(f"burst_seconds must be positive, got {self.burst_seconds!r}")

    @property
    def unlimited(self) -> bool:
        return self.requests_per_minute is None and self.tokens_per_minute is None


@dataclass(frozen=True)
class ProviderConfig:
    """One model provider. ``api_key`` and header values never appear in ``repr``.

    ``max_retries`` is the gateway's retry count on the same provider for transient
    faults (connection error, 429, 5xx); the SDK itself never retries.
    """

    name: str
    kind: ProviderKind = "openai_compatible"
    base_url: str = ""
    api_key: str = field(default="", repr=False)
    default_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout: float = 30.0
    max_retries: int = 1
    models: Mapping[str, ModelInfo] = field(default_factory=dict)
    rate_limit: RateLimit | None = None
    stream: bool = False

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"a provider name must be non-empty and contain no '/', got {self.name!r}")
        if self.kind not in PROVIDER_KINDS:
            raise ValueError(f"provider {self.name!r}: kind must be one of {', '.join(PROVIDER_KINDS)}, got {self.kind!r}")
        if self.kind == "openai_compatible" and not self.base_url:
            raise ValueError(f"provider {self.name!r}: an OpenAI-compatible provider needs a base_url")
        if self.timeout <= 0:
            raise ValueError(f"provider {self.name!r}: timeout must be positive seconds, got {self.timeout!r}")
        if self.max_retries < 0:
            raise ValueError(f"provider {self.name!r}: max_retries must be 0 or more, got {self.max_retries!r}")

    def __repr__(self) -> str:
        key = "set" if self.api_key else "unset"
        headers = sorted(self.default_headers)
        return (
            f"ProviderConfig(name={self.name!r}, kind={self.kind!r}, base_url={self.base_url!r}, api_key=<{key}>, "
            f"default_headers={headers!r}, timeout={self.timeout!r}, max_retries={self.max_retries!r}, "
            f"models={sorted(self.models)!r}, rate_limit={self.rate_limit!r}, stream={self.stream!r})"
        )

    __str__ = __repr__

    def model_info(self, model: str) -> ModelInfo:
        return self.models.get(model) or ModelInfo()

    def secrets(self) -> list[str]:
        """Values that must never be shown: the key and every header value (they often carry tokens)."""
        values = [self.api_key, *self.default_headers.values()]
        return [v for v in values if v and len(v) >= 4]


@dataclass(frozen=True)
class GatewayConfig:
    """Routing and protection settings for a :class:`~llm.gateway.ModelGateway`.

    - ``fallbacks``: ``{"openai/gpt-4o": ["backup/gpt-4o", "demo/planner"]}`` tried in order
      after the primary fails; ``default_fallbacks`` are appended to every route.
    - ``task_models``: ``{"summarize": "openai/gpt-4o-mini"}``: a task class overrides the
      requested model (``act`` normally keeps the agent's own model).
    - ``tenant_rate_limit`` applies to each tenant (``tenant_rate_limits`` per tenant overrides it).
    - ``max_wait_seconds``: how long a call may wait for a rate-limit bucket before failing.
    - ``retry_after_cap_seconds``: the longest a provider's Retry-After is honoured before retrying.
    """

    fallbacks: Mapping[str, list[str]] = field(default_factory=dict)
    default_fallbacks: list[str] = field(default_factory=list)
    task_models: Mapping[str, str] = field(default_factory=dict)
    tenant_rate_limit: RateLimit | None = None
    tenant_rate_limits: Mapping[str, RateLimit] = field(default_factory=dict)
    max_wait_seconds: float = 5.0
    retry_after_cap_seconds: float = 10.0
    retry_backoff_seconds: float = 0.2
    breaker_failure_threshold: int = 5
    breaker_cooldown_seconds: float = 30.0
