"""Exceptions carrying the API's error body: ``{"detail": ..., "error": {"code", "message", "field"}}``."""

from __future__ import annotations

from typing import Any


class AgentOpsError(Exception):
    """Anything this client raises."""


class ApiError(AgentOpsError):
    """The API answered with an error status; ``body`` is its JSON error body (or ``{"detail": <text>}``)."""

    def __init__(self, status: int, body: dict[str, Any], *, method: str = "", url: str = "", retry_after: float | None = None) -> None:
        self.status = status
        self.body = body
        self.method = method
        self.url = url
        self.retry_after = retry_after
        found = body.get("error")
        error: dict[str, Any] = found if isinstance(found, dict) else {}
        self.code: str = str(error.get("code") or "error")
        self.message: str = str(error.get("message") or body.get("detail") or f"HTTP {status}")
        self.field: str | None = error.get("field")
        where = f" ({method} {url})" if method else ""
        super().__init__(f"{status} {self.code}: {self.message}{where}")


class InvalidRequest(ApiError):
    """400 or 422: the request was wrong; ``field`` names what, ``message`` says what is expected."""


class Unauthorized(ApiError):
    """401: no key, or a key that is not (or no longer) valid."""


class Forbidden(ApiError):
    """403: the key may not do this."""


class NotFound(ApiError):
    """404: no such object in the key's tenant (another tenant's object is a 404 too)."""


class Conflict(ApiError):
    """409: the object is not in a state that allows this (e.g. an approval already decided)."""


class RateLimited(ApiError):
    """429 after the client's retries: ``retry_after`` is the API's last ``Retry-After`` in seconds."""


class Unavailable(ApiError):
    """503 after the client's retries: at capacity, or a dependency is down (``body["error"]["dependency"]``)."""


class StreamInterrupted(AgentOpsError):
    """A run's stream kept dropping: reconnects with ``Last-Event-ID`` ran out. ``last_seq`` is the last event received."""

    def __init__(self, run_id: str, last_seq: int, cause: BaseException | None = None) -> None:
        self.run_id = run_id
        self.last_seq = last_seq
        super().__init__(f"the stream of run {run_id} dropped and could not be resumed after seq {last_seq}: {cause}")


_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 422: InvalidRequest,
    429: RateLimited, 503: Unavailable,
}


def error_for(status: int, body: dict[str, Any], *, method: str, url: str, retry_after: float | None) -> ApiError:
    return _BY_STATUS.get(status, ApiError)(status, body, method=method, url=url, retry_after=retry_after)
