"""The model gateway: one ModelClient in front of every provider.

For each call it resolves a route (task class map, then ``provider/model`` plus its ordered
fallbacks), and walks it: skip a provider whose circuit is open, wait (boundedly) for the
provider's and the tenant's token buckets, call, retry once on transient faults (connection
error, 429 honouring Retry-After up to a cap, 5xx), then fail over to the next model. Every
attempt becomes a ``model.attempt`` trace entry; the response carries the model actually used
and the cost from the price table.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llm.breaker import CircuitBreaker
from llm.config import GatewayConfig, ProviderConfig
from llm.errors import (
    AllRoutesFailedError,
    CircuitOpenError,
    ContextTooLargeError,
    ModelError,
    NoRouteError,
    ProviderError,
    ProviderRateLimitedError,
    RateLimitExceededError,
    UnknownModelError,
    redact,
)
from llm.openai_client import ConnectionCheck, OpenAICompatibleClient, split_model
from llm.planner import DeterministicPlanner
from llm.pricing import DEMO_PRICE_LABEL, PriceTable, is_demo_price
from llm.ratelimit import BucketStore, RateLimiter, buckets_for
from llm.streaming import DeltaListener, TextStreamingClient
from runtime.protocols import ModelClient
from runtime.tokens import count_messages, count_specs
from runtime.types import ModelRequest, ModelResponse

log = logging.getLogger(__name__)

ClientFactory = Callable[[ProviderConfig], ModelClient]


def _openai_factory(config: ProviderConfig) -> ModelClient:
    return OpenAICompatibleClient(config)


def _planner_factory(config: ProviderConfig) -> ModelClient:
    return DeterministicPlanner(model=f"{config.name}/planner")


DEFAULT_FACTORIES: dict[str, ClientFactory] = {
    "openai_compatible": _openai_factory,
    "deterministic": _planner_factory,
}


@dataclasses.dataclass
class _Streaming:
    """One ``complete`` call's delta listener and the attempts it has seen (numbered across retries and failover)."""

    listener: DeltaListener
    attempts: int = 0


class ModelGateway:
    """Routing, rate limits, retries, failover, circuit breaking and pricing over many providers.

    ``bucket_store``: a :class:`~llm.ratelimit.RedisBucketStore` to share limits across
    processes (default: in-process). ``clients`` overrides the client of a provider by name
    (tests, the scripted model); ``factories`` adds or replaces client factories per provider kind.
    """

    def __init__(
        self,
        providers: Iterable[ProviderConfig],
        config: GatewayConfig | None = None,
        *,
        bucket_store: BucketStore | None = None,
        clients: Mapping[str, ModelClient] | None = None,
        factories: Mapping[str, ClientFactory] | None = None,
        breaker: CircuitBreaker | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or GatewayConfig()
        self.providers: dict[str, ProviderConfig] = {}
        for provider in providers:
            if provider.name in self.providers:
                raise ValueError(f"provider {provider.name!r} is configured twice")
            self.providers[provider.name] = provider
        self.prices = PriceTable(self.providers.values())
        self.breaker = breaker or CircuitBreaker(
            failure_threshold=self.config.breaker_failure_threshold,
            cooldown_seconds=self.config.breaker_cooldown_seconds,
            clock=clock,
        )
        self.limiter = RateLimiter(bucket_store, max_wait=self.config.max_wait_seconds, sleep=sleep, clock=clock)
        self._sleep = sleep
        self._clock = clock
        self._secrets = [s for p in self.providers.values() for s in p.secrets()]
        self._factories = {**DEFAULT_FACTORIES, **(factories or {})}
        self._clients: dict[str, ModelClient] = dict(clients or {})
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ModelGateway(providers={sorted(self.providers)!r})"

    # -- clients and routes ---------------------------------------------------------------

    def client(self, provider: str) -> ModelClient:
        with self._lock:
            existing = self._clients.get(provider)
            if existing is not None:
                return existing
            config = self.providers[provider]
            factory = self._factories.get(config.kind)
            if factory is None:
                raise NoRouteError(f"provider {provider!r} has kind {config.kind!r}, for which no client is known")
            created = self._clients[provider] = factory(config)
            return created

    def _qualify(self, model: str) -> str:
        if "/" in model:
            return model
        offering = [p.name for p in self.providers.values() if model in p.models]
        if offering:
            return f"{offering[0]}/{model}"
        if len(self.providers) == 1:
            return f"{next(iter(self.providers))}/{model}"
        raise NoRouteError(
            f"model {model!r} names no provider and none of the configured providers "
            f"({', '.join(sorted(self.providers)) or 'none'}) lists it; use 'provider/model'"
        )

    def route(self, request: ModelRequest) -> list[str]:
        """The ordered models to try for this request (primary first)."""
        requested = self._qualify(request.model) if request.model else ""
        primary = self.config.task_models.get(request.task) or requested
        if not primary:
            raise NoRouteError("the request names no model and its task class has no model configured")
        primary = self._qualify(primary)
        chain = [primary, *self.config.fallbacks.get(primary, [])]
        if requested and requested != primary:
            chain += [requested, *self.config.fallbacks.get(requested, [])]
        chain += list(self.config.default_fallbacks)
        return list(dict.fromkeys(self._qualify(m) for m in chain))

    # -- the call -------------------------------------------------------------------------

    def complete(self, request: ModelRequest, *, deltas: DeltaListener | None = None) -> ModelResponse:
        """``deltas``: told the text of each attempt as the provider streams it (see :mod:`llm.streaming`)."""
        trace: list[dict[str, Any]] = []
        streaming = _Streaming(deltas) if deltas is not None else None
        try:
            chain = self.route(request)
        except ModelError as exc:
            exc.trace = trace
            raise
        tenant = str(request.metadata.get("tenant") or "")
        estimates: dict[str, int] = {}
        errors: list[tuple[str, ModelError]] = []
        for target in chain:
            provider_name, model = split_model(target)
            try:
                response = self._try_target(request, target, provider_name, model, tenant, estimates, trace, streaming)
            except RateLimitExceededError as exc:
                errors.append((target, exc))
                if exc.scope.startswith("tenant:"):
                    break  # the tenant's budget is the same whichever provider is used
                continue
            except ModelError as exc:
                errors.append((target, exc))
                continue
            if len(errors):
                log.info(
                    "model call for run %s served by %s after %d failed route(s)",
                    request.metadata.get("run_id"),
                    target,
                    len(errors),
                )
            return response
        raise self._failure(request, chain, errors, trace)

    def _try_target(
        self,
        request: ModelRequest,
        target: str,
        provider_name: str,
        model: str,
        tenant: str,
        estimates: dict[str, int],
        trace: list[dict[str, Any]],
        streaming: _Streaming | None = None,
    ) -> ModelResponse:
        provider = self.providers.get(provider_name)
        base = {"type": "model.attempt", "provider": provider_name, "model": model, "target": target}
        if provider is None:
            error: ModelError = NoRouteError(
                f"no provider named {provider_name!r} is configured (known: {', '.join(sorted(self.providers))})",
                provider=provider_name,
                model=model,
            )
            trace.append(self._attempt(base, 0, error, 0.0))
            raise error
        if provider.kind == "openai_compatible" and provider.models and model not in provider.models:
            error = UnknownModelError(
                f"model {model!r} is not configured for provider {provider_name!r} (configured: {', '.join(sorted(provider.models))})",
                provider=provider_name,
                model=model,
            )
            trace.append(self._attempt(base, 0, error, 0.0))
            raise error
        if target not in estimates:
            estimates[target] = count_messages(request.messages, model) + count_specs(request.tools, model)
        max_output = int(getattr(request, "max_output_tokens", None) or 0)
        estimate = estimates[target] + max_output  # the token buckets assume the reply may use all of it
        info = provider.models.get(model)
        if info is not None and estimate > info.context_window:
            reply = f" plus up to {max_output} output tokens" if max_output else ""
            error = ContextTooLargeError(
                f"the request has about {estimates[target]} input tokens{reply}, more than the "
                f"{info.context_window}-token context window of {target}",
                provider=provider_name,
                model=model,
            )
            trace.append(self._attempt(base, 0, error, 0.0))
            raise error
        allowed, retry_in = self.breaker.allow(provider_name)
        if not allowed:
            error = CircuitOpenError(
                f"provider {provider_name!r} is skipped: its circuit is open after repeated failures (next probe in {retry_in:.0f} s)",
                provider=provider_name,
                model=model,
                retry_in=retry_in,
            )
            trace.append(self._attempt(base, 0, error, 0.0))
            raise error
        buckets = buckets_for("provider", provider_name, provider.rate_limit, estimate, f"provider {provider_name!r}")
        if tenant:
            limit = self.config.tenant_rate_limits.get(tenant, self.config.tenant_rate_limit)
            buckets += buckets_for("tenant", tenant, limit, estimate, f"tenant {tenant!r}")
        try:
            waited = self.limiter.acquire(buckets, what=f"a call to {target}" + (f" for tenant {tenant!r}" if tenant else ""))
        except RateLimitExceededError as exc:
            self.breaker.release(provider_name)
            exc.provider, exc.model = provider_name, model
            trace.append(self._attempt(base, 0, exc, 0.0))
            raise
        client = self.client(provider_name)
        sub_request = dataclasses.replace(request, model=target)
        attempts = provider.max_retries + 1
        for attempt in range(1, attempts + 1):
            started = self._clock()
            try:
                response = self._call(client, sub_request, streaming)
            except ModelError as exc:
                latency = self._clock() - started
                self._record_health(provider_name, exc)
                trace.append(self._attempt(base, attempt, exc, latency, waited))
                log.warning("model attempt %d on %s failed: %s", attempt, target, self._clean(str(exc)))
                delay = self._retry_delay(exc, attempt, attempts, provider_name)
                if delay is None:
                    raise
                self._sleep(delay)
                continue
            except Exception as exc:  # a client bug must still fail over, with a readable reason
                latency = self._clock() - started
                self.breaker.release(provider_name)
                wrapped = ProviderError(
                    f"provider {provider_name!r} failed unexpectedly for model {model!r} "
                    f"({type(exc).__name__}: {self._clean(str(exc))[:300]})",
                    provider=provider_name,
                    model=model,
                )
                trace.append(self._attempt(base, attempt, wrapped, latency, waited))
                log.exception("model client for %s raised unexpectedly", target)
                raise wrapped from None
            latency = self._clock() - started
            self.breaker.record_success(provider_name)
            usage = self.prices.priced(target, response.usage)
            actual = usage.input_tokens + usage.output_tokens
            self.limiter.settle([dataclasses.replace(b, amount=actual - b.amount) for b in buckets if b.key.endswith(":tokens")])
            ok = {
                **base,
                "attempt": attempt,
                "outcome": "ok",
                "status_code": 200,
                "latency_ms": round(latency * 1000, 1),
                "error": None,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cost": usage.cost,
                "priced": self.prices.known(target),
            }
            if is_demo_price(target) and self.prices.known(target):
                ok["price"] = DEMO_PRICE_LABEL  # not a real price: the trace says so
            if waited:
                ok["rate_limit_wait_ms"] = round(waited * 1000, 1)
            trace.append(ok)
            return dataclasses.replace(response, model=target, usage=usage, trace=[*trace, *response.trace])
        raise AssertionError("unreachable: the retry loop returns or raises")  # pragma: no cover

    @staticmethod
    def _call(client: ModelClient, request: ModelRequest, streaming: _Streaming | None) -> ModelResponse:
        if streaming is None or not isinstance(client, TextStreamingClient):
            return client.complete(request)
        streaming.attempts += 1
        sink = streaming.listener.open(request, streaming.attempts)
        broken = False

        def on_text(text: str) -> None:
            nonlocal broken
            if broken:
                return
            try:
                sink.write(text)
            except Exception:  # a listener's fault never fails the model call
                broken = True
                log.warning("the delta listener failed; no more deltas for this attempt", exc_info=True)

        try:
            return client.complete_streaming(request, on_text)
        finally:
            try:
                sink.close()
            except Exception:
                log.warning("the delta listener failed to close", exc_info=True)

    def _record_health(self, provider: str, exc: ModelError) -> None:
        if exc.health:
            if self.breaker.record_failure(provider):
                log.warning("circuit for provider %s opened for %.0f s", provider, self.breaker.cooldown_seconds)
        else:
            self.breaker.release(provider)

    def _retry_delay(self, exc: ModelError, attempt: int, attempts: int, provider: str) -> float | None:
        """Seconds to wait before retrying the same provider, or None to fail over now."""
        if not exc.retryable or attempt >= attempts:
            return None
        allowed, _ = self.breaker.allow(provider)
        if not allowed:
            return None
        cap = self.config.retry_after_cap_seconds
        if isinstance(exc, ProviderRateLimitedError) and exc.retry_after is not None:
            if exc.retry_after > cap:
                return None  # waiting less than the provider asked would only earn another 429
            return exc.retry_after
        return min(cap, self.config.retry_backoff_seconds * attempt)

    def _attempt(self, base: dict[str, Any], attempt: int, exc: ModelError, latency: float, waited: float = 0.0) -> dict[str, Any]:
        payload = {
            **base,
            "attempt": attempt,
            "outcome": exc.outcome,
            "status_code": exc.status_code,
            "latency_ms": round(latency * 1000, 1),
            "error": self._clean(str(exc)),
        }
        if isinstance(exc, ProviderRateLimitedError) and exc.retry_after is not None:
            payload["retry_after"] = exc.retry_after
        if waited:
            payload["rate_limit_wait_ms"] = round(waited * 1000, 1)
        return payload

    def _failure(
        self, request: ModelRequest, chain: list[str], errors: list[tuple[str, ModelError]], trace: list[dict[str, Any]]
    ) -> ModelError:
        if len(errors) == 1:
            error = errors[0][1]  # one route, or stopped early (the tenant's rate limit)
        else:
            parts = "; ".join(f"{target}: {self._clean(str(exc))}" for target, exc in errors)
            error = AllRoutesFailedError(
                f"every model tried for {request.model!r} failed ({len(errors)} of {len(chain)}): {parts}",
                errors=[e for _, e in errors],
                model=request.model,
            )
        error.trace = trace
        return error

    def _clean(self, text: str) -> str:
        return redact(text, self._secrets)

    # -- admin ----------------------------------------------------------------------------

    def test_connection(self, provider: str) -> ConnectionCheck:
        config = self.providers[provider]
        client = self.client(provider)
        if isinstance(client, OpenAICompatibleClient):
            return client.test_connection()
        return ConnectionCheck(True, provider, config.base_url, f"provider {provider!r} is {config.kind}; nothing to connect to")

    def close(self) -> None:
        for client in self._clients.values():
            close = getattr(client, "close", None)
            if callable(close):
                close()
