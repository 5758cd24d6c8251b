"""Model-call failures, worded for the operator who reads them in a trace or a log.

Every error names the provider (and model where relevant), never a key. ``retryable`` says
whether the gateway may try the same provider again; ``health`` whether the failure counts
against the provider's circuit breaker.
"""

from __future__ import annotations

from typing import Any


class ModelError(Exception):
    """Base class for everything the model layer raises."""

    retryable = False
    health = False
    outcome = "error"

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        model: str = "",
        status_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.model = model
        self.status_code = status_code
        #: Attempt payloads gathered before the failure (the gateway fills it).
        self.trace: list[dict[str, Any]] = []

    def __str__(self) -> str:
        return self.message


class ProviderError(ModelError):
    """A provider call failed."""


class ProviderConnectionError(ProviderError):
    retryable = True
    health = True
    outcome = "connection_error"


class ProviderTimeoutError(ProviderError):
    """The provider did not answer in time. Not retried on the same provider (it would double the wait)."""

    health = True
    outcome = "timeout"


class ProviderAuthError(ProviderError):
    outcome = "auth_error"


class UnknownModelError(ProviderError):
    outcome = "unknown_model"


class ProviderRateLimitedError(ProviderError):
    retryable = True
    outcome = "rate_limited"

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ProviderServerError(ProviderError):
    retryable = True
    health = True
    outcome = "server_error"


class ProviderBadRequestError(ProviderError):
    """The provider rejected the request itself (400/422): retrying the same request will not help."""

    outcome = "bad_request"


class MalformedResponseError(ProviderError):
    outcome = "malformed_response"


class GatewayError(ModelError):
    """The gateway refused or could not complete a call."""


class NoRouteError(GatewayError):
    outcome = "no_route"


class RateLimitExceededError(GatewayError):
    """A local/shared token bucket stayed empty for longer than the gateway may wait."""

    outcome = "rate_limit_wait_exceeded"

    def __init__(self, message: str, *, scope: str = "", wait_seconds: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.scope = scope
        self.wait_seconds = wait_seconds


class CircuitOpenError(GatewayError):
    outcome = "circuit_open"

    def __init__(self, message: str, *, retry_in: float = 0.0, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_in = retry_in


class ContextTooLargeError(GatewayError):
    outcome = "context_too_large"


class AllRoutesFailedError(GatewayError):
    """Every model in the route (primary and fallbacks) failed; ``errors`` holds each last failure."""

    outcome = "all_routes_failed"

    def __init__(self, message: str, *, errors: list[ModelError], **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.errors = errors


def redact(text: str, secrets: list[str]) -> str:
    """Remove every secret (and its first/last 8 characters, which providers like to echo) from text."""
    for secret in secrets:
        if not secret:
            continue
        text = text.replace(secret, "[redacted]")
        if len(secret) >= 16:
            for part in (secret[:8], secret[-8:]):
                text = text.replace(part, "[redacted]")
    return text
