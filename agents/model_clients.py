"""Which ModelClient a run talks to: a ModelGateway over the providers its tenant may use.

The providers of a run are the tenant's own Provider rows, the shared rows (no tenant), the
implicit ``openai`` provider from ``OPENAI_BASE_URL`` (see :mod:`agents.providers`) and the
built-in deterministic ``demo``. Routing comes from the agent version's policy::

    "model": {"fallbacks": ["backup/gpt-4o-mini", "demo/planner"], "task_models": {"summarize": "openai/gpt-4o-mini"}}

and the tenant's rate limit from ``tenant.settings["rate_limit"]`` (``requests_per_minute``,
``tokens_per_minute``). A tenant's own providers go through the egress guard (see
:mod:`agents.providers`). Rate-limit buckets live in Redis when ``REDIS_URL`` is set, so every
worker process shares one budget per provider and per tenant.

Gateways are cached per process, keyed by the tenant, a fingerprint of the provider rows
(``id``, ``updated_at``) and the environment default, and the routing settings: circuit-breaker
state survives from one run to the next in a worker, and an admin change takes effect on the
next run. A provider that cannot be used (disabled, unreadable key, not configured) is not left
out silently: calls to it fail with a message saying what to fix, which the run's trace shows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from agents.models import Provider
from agents.providers import (
    BUILTIN_PROVIDER,
    ENV_PROVIDER,
    SecretError,
    egress_allow,
    env_default_provider,
    env_settings,
    guarded_client_for,
    provider_config,
)
from agents.run_deltas import RunDeltas
from agents.run_policy import policy_for
from core.buckets import bucket_store
from llm import GatewayConfig, ModelGateway, ModelInfo, ProviderConfig, ProviderError, RateLimit
from llm.breaker import CircuitBreaker
from llm.openai_client import split_model
from llm.pricing import DEMO_PRICES
from llm.ratelimit import Bucket, BucketStore
from llm.streaming import DeltaListener
from runtime.protocols import ModelClient
from runtime.types import ModelRequest, ModelResponse

log = logging.getLogger(__name__)

GATEWAY_CACHE_SIZE = 128
_lock = threading.RLock()
_gateways: OrderedDict[tuple[Any, ...], ModelGateway] = OrderedDict()
_breakers: OrderedDict[tuple[Any, ...], CircuitBreaker] = OrderedDict()


class UnavailableProvider:
    """Stands in for a provider that cannot be called; every call fails with the reason (and fails over)."""

    def __init__(self, provider: str, reason: str) -> None:
        self.provider = provider
        self.reason = reason

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise ProviderError(self.reason, provider=self.provider, model=split_model(request.model)[1])


class TenantModelClient:
    """The gateway as the run's ModelClient: tags each request with the tenant (its rate limit)."""

    def __init__(self, gateway: ModelGateway, tenant: str, deltas: DeltaListener | None = None) -> None:
        self.gateway = gateway
        self.tenant = tenant
        self.deltas = deltas

    def complete(self, request: ModelRequest) -> ModelResponse:
        tagged = dataclasses.replace(request, metadata={**request.metadata, "tenant": self.tenant})
        return self.gateway.complete(tagged, deltas=self.deltas)


class ScopedBucketStore:
    """Gives each provider row its own buckets: tenants may each have an ``openai`` of their own."""

    def __init__(self, inner: BucketStore, provider_keys: Mapping[str, str]) -> None:
        self.inner = inner
        self.provider_keys = dict(provider_keys)

    def _scoped(self, buckets: list[Bucket]) -> list[Bucket]:
        scoped = []
        for bucket in buckets:
            scope, _, rest = bucket.key.partition(":")
            name, _, what = rest.partition(":")
            if scope == "provider" and name in self.provider_keys:
                bucket = dataclasses.replace(bucket, key=f"provider:{self.provider_keys[name]}:{what}")
            scoped.append(bucket)
        return scoped

    def take(self, buckets: list[Bucket]) -> tuple[float, int]:
        return self.inner.take(self._scoped(buckets))

    def charge(self, buckets: list[Bucket]) -> None:
        self.inner.charge(self._scoped(buckets))


def _routing(run: Any) -> dict[str, Any]:
    try:
        routing = policy_for(run).policy.model
    except ValueError:
        return {"fallbacks": [], "task_models": {}}  # the loop reports the invalid policy itself
    return {"fallbacks": list(routing.fallbacks), "task_models": dict(routing.task_models)}


def tenant_rate_limit(tenant: Any) -> RateLimit | None:
    raw = (tenant.settings or {}).get("rate_limit")
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        return RateLimit(requests_per_minute=raw.get("requests_per_minute"), tokens_per_minute=raw.get("tokens_per_minute"))
    except (TypeError, ValueError) as exc:
        log.warning("tenant %s has an invalid rate_limit setting (%s); no tenant rate limit applies", tenant.pk, exc)
        return None


def _tenant_providers(tenant_id: int) -> list[Provider]:
    return list(Provider.objects.visible_to_tenant(tenant_id).order_by("name", "tenant_id"))


def _chosen_rows(tenant_id: int) -> list[Provider]:
    """The rows a run of this tenant uses: its own win over shared ones of the same name."""
    rows: dict[str, Provider] = {}
    for row in _tenant_providers(tenant_id):
        if row.name not in rows or row.tenant_id is not None:
            rows[row.name] = row
    return list(rows.values())


def _build(rows: list[Provider], routing: dict[str, Any], model: str, rate: RateLimit | None, breaker: CircuitBreaker) -> ModelGateway:
    # The built-in planner carries the demo price table (labelled "demo price" wherever a cost is shown).
    providers: list[ProviderConfig] = [ProviderConfig(name=BUILTIN_PROVIDER, kind="deterministic", models=DEMO_PRICES)]
    clients: dict[str, ModelClient] = {}
    keys: dict[str, str] = {}
    for row in rows:
        if row.name == BUILTIN_PROVIDER:
            continue
        keys[row.name] = f"t{row.tenant_id}.{row.name}" if row.tenant_id else f"shared.{row.name}"
        reason = ""
        if not row.enabled:
            reason = f"provider {row.name!r} is disabled; an operator can enable it in the admin (Agents › Providers)"
        else:
            try:
                config = provider_config(row)
                guarded = guarded_client_for(row, config)
                if guarded is not None:
                    clients[row.name] = guarded
                providers.append(config)
                continue
            except (SecretError, ValueError) as exc:
                reason = f"provider {row.name!r} is misconfigured: {exc}"
        providers.append(ProviderConfig(name=row.name, kind="deterministic"))
        clients[row.name] = UnavailableProvider(row.name, reason)
    names = {p.name for p in providers}
    if ENV_PROVIDER not in names:
        try:
            default = env_default_provider()
        except ValueError as exc:
            default = ProviderConfig(name=ENV_PROVIDER, kind="deterministic")
            clients[ENV_PROVIDER] = UnavailableProvider(ENV_PROVIDER, f"the default provider {ENV_PROVIDER!r} is misconfigured: {exc}")
        if default is not None:
            providers.append(default)
            names.add(ENV_PROVIDER)
            keys[ENV_PROVIDER] = f"env.{ENV_PROVIDER}"
    wanted = [model, *routing["fallbacks"], *routing["task_models"].values()]
    for target in wanted:
        name, _ = split_model(target)
        if name and name not in names:
            names.add(name)
            hint = " or set OPENAI_BASE_URL (and OPENAI_API_KEY) for the default one" if name == ENV_PROVIDER else ""
            providers.append(ProviderConfig(name=name, kind="deterministic"))
            clients[name] = UnavailableProvider(
                name, f"no provider named {name!r} is configured for this tenant: add one in the admin (Agents › Providers){hint}"
            )
    config = GatewayConfig(default_fallbacks=routing["fallbacks"], task_models=routing["task_models"], tenant_rate_limit=rate)
    return ModelGateway(providers, config, bucket_store=ScopedBucketStore(bucket_store(), keys), clients=clients, breaker=breaker)


def gateway_for(run: Any) -> ModelGateway:
    """The (cached) gateway for this run's tenant, providers and routing."""
    cached = getattr(run, "_model_gateway", None)
    if cached is not None:
        return cached
    rows = _chosen_rows(run.tenant_id)
    routing = _routing(run)
    rate = tenant_rate_limit(run.tenant)
    base_url, api_key, _, models_json = env_settings()
    env_fp = hashlib.sha256(json.dumps([base_url, api_key, models_json, egress_allow()]).encode()).hexdigest()[:16]
    providers_fp = (run.tenant_id, tuple((r.pk, r.updated_at.isoformat()) for r in rows), env_fp)
    key = (*providers_fp, json.dumps(routing, sort_keys=True), run.version.model, repr(rate))
    with _lock:
        gateway = _gateways.get(key)
        if gateway is not None:
            _gateways.move_to_end(key)
        else:
            breaker = _breakers.get(providers_fp)
            if breaker is None:
                breaker = _breakers[providers_fp] = CircuitBreaker()
                _trim(_breakers)
            gateway = _gateways[key] = _build(rows, routing, run.version.model, rate, breaker)
            _trim(_gateways)
    run._model_gateway = gateway
    return gateway


def _trim(cache: OrderedDict[tuple[Any, ...], Any]) -> None:
    while len(cache) > GATEWAY_CACHE_SIZE:
        cache.popitem(last=False)  # older gateways are dropped, not closed: a run may still use one


def clear_cache() -> None:
    with _lock:
        _gateways.clear()
        _breakers.clear()


def model_client_for(run: Any) -> ModelClient:
    """The run's client; the text it streams goes to the run's watchers as ``message.delta`` (agents/run_deltas.py)."""
    return TenantModelClient(gateway_for(run), f"t{run.tenant_id}", deltas=RunDeltas(run.pk))


def model_info_for(run: Any) -> ModelInfo | None:
    """Prices and context window of the version's model (None when the price table does not list it)."""
    return gateway_for(run).prices.info(run.version.model)
