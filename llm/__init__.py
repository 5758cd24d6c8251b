"""The model gateway: providers behind one ModelClient (see ``gateway.ModelGateway``). No Django here."""

from __future__ import annotations

from llm.config import GatewayConfig, ModelInfo, ProviderConfig, RateLimit
from llm.errors import (
    AllRoutesFailedError,
    CircuitOpenError,
    ContextTooLargeError,
    GatewayError,
    MalformedResponseError,
    ModelError,
    NoRouteError,
    ProviderAuthError,
    ProviderBadRequestError,
    ProviderConnectionError,
    ProviderError,
    ProviderRateLimitedError,
    ProviderServerError,
    ProviderTimeoutError,
    RateLimitExceededError,
    UnknownModelError,
)
from llm.gateway import ModelGateway
from llm.openai_client import ConnectionCheck, OpenAICompatibleClient
from llm.planner import DeterministicPlanner
from llm.ratelimit import LocalBucketStore, RedisBucketStore

__all__ = [
    "AllRoutesFailedError",
    "CircuitOpenError",
    "ConnectionCheck",
    "ContextTooLargeError",
    "DeterministicPlanner",
    "GatewayConfig",
    "GatewayError",
    "LocalBucketStore",
    "MalformedResponseError",
    "ModelError",
    "ModelGateway",
    "ModelInfo",
    "NoRouteError",
    "OpenAICompatibleClient",
    "ProviderAuthError",
    "ProviderBadRequestError",
    "ProviderConfig",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderRateLimitedError",
    "ProviderServerError",
    "ProviderTimeoutError",
    "RateLimit",
    "RateLimitExceededError",
    "RedisBucketStore",
    "UnknownModelError",
]
