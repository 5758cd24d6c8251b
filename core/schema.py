"""OpenAPI: every operation documents the errors the API answers with, and the shape of their bodies.

A drf-spectacular postprocessing hook, so no view repeats them: 400 (a field or parameter was wrong), 401 (no or a
bad key), 403 (the role does not allow it), 404 (not found here; operations with a path parameter), 406 (an
``Accept`` the API cannot produce), 413 (a body over the limit), 415 (a body that is not JSON or a form), 429
(throttled, with ``Retry-After``) and 503 (the database or Redis is down, with ``Retry-After``: core/outages.py).
Codes a view documents itself are kept.
"""

from __future__ import annotations

from typing import Any

ERROR = "Error"
VALIDATION_ERROR = "ValidationError"
UNAVAILABLE = "DependencyUnavailable"

_ERROR_OBJECT: dict[str, Any] = {
    "type": "object",
    "description": (
        "The one error object (core/errors.py): ``code`` is stable and machine-readable (invalid, not_found, "
        "forbidden, conflict, not_authenticated, throttled, ...), ``message`` says what was wrong and what is "
        "expected, ``field`` names the input at fault (a dotted path into the body, a query parameter or a header), "
        "or is null."
    ),
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "field": {"type": "string", "nullable": True},
    },
    "required": ["code", "message", "field"],
}

_SCHEMAS: dict[str, dict[str, Any]] = {
    ERROR: {
        "type": "object",
        "description": "What was wrong and what to do about it: ``error``; ``detail`` repeats the message for older clients.",
        "properties": {"error": _ERROR_OBJECT, "detail": {"type": "string"}},
        "required": ["error"],
        "example": {"detail": "The run already finished (final_answer); there is nothing to cancel.", "error": {
            "code": "conflict", "message": "The run already finished (final_answer); there is nothing to cancel.", "field": None}},
    },
    VALIDATION_ERROR: {
        "type": "object",
        "description": (
            "``error`` names the first problem. Beside it, each key names a field, query parameter or header that was "
            "wrong (``detail`` for the body as a whole, ``non_field_errors`` for a combination); each value lists the "
            "problems, or maps a nested key to them."
        ),
        "properties": {"error": _ERROR_OBJECT},
        "required": ["error"],
        "additionalProperties": {
            "anyOf": [{"type": "string"}, {"type": "array", "items": {}}, {"type": "object"}],
        },
        "example": {"facts": ["Keys must match ^[A-Za-z][A-Za-z0-9_.:-]{0,63}$; got ''."], "error": {
            "code": "invalid", "message": "Keys must match ^[A-Za-z][A-Za-z0-9_.:-]{0,63}$; got ''.", "field": "facts"}},
    },
    UNAVAILABLE: {
        "type": "object",
        "description": "A dependency is down (core/outages.py); retry after Retry-After seconds, with the same Idempotency-Key.",
        "properties": {
            "detail": {"type": "string"},
            "error": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "enum": ["dependency_unavailable"]},
                    "message": {"type": "string"},
                    "field": {"type": "string", "nullable": True},
                    "dependency": {"type": "string", "enum": ["database", "redis"]},
                },
                "required": ["code", "message", "field", "dependency"],
            },
        },
        "required": ["detail", "error"],
        "example": {"detail": "The database is unavailable; retry shortly.", "error": {
            "code": "dependency_unavailable", "message": "The database is unavailable; retry shortly.", "field": None,
            "dependency": "database"}},
    },
}

_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer", "minimum": 0}},
}

_ALWAYS: dict[str, tuple[str, str]] = {
    "400": (VALIDATION_ERROR, "A field, query parameter or header was wrong (or the body is not valid JSON); the body names it."),
    "401": (ERROR, "No valid API key (Authorization: Bearer <key>) or session."),
    "403": (ERROR, "The key's role in this tenant does not allow this action."),
    "406": (ERROR, "The Accept header asks for a format the API does not produce (it produces JSON)."),
    "413": (ERROR, "The request body is larger than the documented limit (MAX_REQUEST_BODY_BYTES, 2.5 MB by default)."),
    "429": (ERROR, "Too many requests for this key; retry after Retry-After seconds."),
    "503": (UNAVAILABLE, "The database or Redis is unavailable; retry after Retry-After seconds."),
}
_WITH_PATH_PARAMETER = {"404": (ERROR, "No such object among the tenants this key can see.")}
_WITH_BODY = {"415": (ERROR, "The body is not application/json (or a form).")}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _response(schema: str, description: str, status: str) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}
    if status in ("429", "503"):
        response["headers"] = dict(_RETRY_AFTER)
    return response


def _described(response: dict[str, Any], status: str) -> str:
    description = response.get("description") or ""
    if description and description != "No response body":
        return str(description)
    return "The object is in a state that does not allow this (e.g. a version a run used)." if status == "409" else "Refused."


def _has_path_parameter(path_item: dict[str, Any], operation: dict[str, Any]) -> bool:
    parameters = [*path_item.get("parameters", []), *operation.get("parameters", [])]
    return any(p.get("in") == "path" for p in parameters)


def document_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Add the common error responses to every operation (codes an operation documents itself win)."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(_SCHEMAS)
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            codes = dict(_ALWAYS)
            if _has_path_parameter(path_item, operation):
                codes.update(_WITH_PATH_PARAMETER)
            if "requestBody" in operation:
                codes.update(_WITH_BODY)
            responses = operation.setdefault("responses", {})
            for status, (schema, description) in codes.items():
                existing = responses.get(status)
                if existing is None or "content" not in existing:
                    responses[status] = _response(schema, description, status)
            for status, response in responses.items():  # e.g. a view's ``409: None``: errors always have a body
                if status.startswith("4") and "content" not in response:
                    responses[status] = _response(ERROR, _described(response, status), status)
    return result
