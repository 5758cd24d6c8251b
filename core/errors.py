"""The one family of domain errors. Services raise these; the API maps them to HTTP once (core.api).

Every API error answers with ``{"error": {"code": ..., "message": ..., "field": ...}}`` and ``status``:
``code`` is stable and machine-readable, ``message`` says what was wrong and what is expected,
``field`` names the input at fault (or is null). Beside ``error`` the body keeps DRF's keys, so
clients written against them go on working: ``{field: [message]}`` when a field is at fault,
``{"non_field_errors": [message]}`` for another 400, ``{"detail": message}`` otherwise.
Subclass the one whose status fits and give it a ``code``; pass ``field=`` where one input is at fault.
The admin, management commands and pages show ``message``.
"""

from __future__ import annotations

from typing import Any


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

    def __str__(self) -> str:
        return self.message

    def details(self) -> Any:
        """DRF's value under ``field`` (a list of messages); a subclass with several problems returns them all."""
        return [self.message]

    def headers(self) -> dict[str, str]:
        """Response headers the refusal needs (e.g. ``Retry-After``); none by default."""
        return {}

    def body(self) -> dict[str, Any]:
        if self.field:
            body: dict[str, Any] = {self.field: self.details()}
        elif self.status == 400:
            body = {"non_field_errors": self.details()}
        else:
            body = {"detail": self.message}
        body["error"] = {"code": self.code, "message": self.message, "field": self.field}
        return body


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


class Refused(DomainError):
    """A request refused either for one input (``field`` given: 400 ``invalid``) or for the object's state (409
    ``conflict``): the services' refusals, where the same rule can be either (``RunRefused``, ``ToolRefused``, ...)."""

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None, status: int | None = None) -> None:
        super().__init__(message, field=field, code=code or ("invalid" if field else "conflict"),
                         status=status or (400 if field else 409))


class InvalidDocument(Invalid):
    """A JSON document (config, weights, a provider) with several problems, each listed under ``field``."""

    def __init__(self, message: str, *, field: str, errors: Any) -> None:
        super().__init__(message, field=field)
        self.errors = errors

    def details(self) -> Any:
        return self.errors


def only_fields(what: str, given: Any, allowed: Any, error: type[DomainError] = Invalid) -> None:
    """Refuse a change naming fields outside ``allowed`` (``what``: "A tenant's"), naming the first at fault."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise error(f"{what} {', '.join(unknown)} cannot be changed; expected only {', '.join(allowed)}.", field=unknown[0])
