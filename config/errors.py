"""The one family of domain errors. Services raise these; the API maps them to HTTP once (config.api).

Every error answers as ``{"error": {"code": ..., "message": ..., "field": ...}}`` with ``status``:
``code`` is stable and machine-readable, ``message`` says what was wrong and what is expected,
``field`` names the input at fault (or is null). Subclass the one whose status fits and give it a
``code``; pass ``field=`` where one input is at fault.
"""

from __future__ import annotations


class DomainError(Exception):
    """A request the domain refuses. The message is written for the person (or model) who sent it."""

    code = "refused"
    status = 400

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}


class Invalid(DomainError):
    """The input is malformed or breaks a rule (400)."""

    code = "invalid"
    status = 400


class Forbidden(DomainError):
    """The actor may see the object but not do this to it (403)."""

    code = "forbidden"
    status = 403


class NotFound(DomainError):
    """No such object for this actor; a foreign tenant's object is not found, never forbidden (404)."""

    code = "not_found"
    status = 404


class Conflict(DomainError):
    """The object's current state does not allow this now (409)."""

    code = "conflict"
    status = 409
