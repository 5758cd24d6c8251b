"""API-wide error shape: every error says what was wrong and what is expected; never a bare 500 (an outage is a 503).

One body for every error the API answers (core/errors.py)::

    {"error": {"code": "invalid", "message": "...", "field": "agent"}, "agent": ["..."]}

``error`` is the contract; DRF's keys beside it (``detail``, or the fields at fault) stay for older clients. The
services' :class:`~core.errors.DomainError` refusals are mapped here, once; no view catches them.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core import outages
from core.errors import DomainError
from core.parsers import too_big_message

log = logging.getLogger(__name__)


def error_object(code: str, message: str, field: str | None = None) -> dict[str, str | None]:
    return {"code": code, "message": message, "field": field}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return Response(exc.body(), status=exc.status, headers=exc.headers())
    response = drf_exception_handler(exc, context)
    if response is not None:
        return _with_error_object(response, exc)
    known = _client_error(exc)
    if known is not None:
        return known
    dependency = outages.dependency_down(exc)
    if dependency is not None:  # the database or Redis is down: a 503 the client retries, not a 500
        outages.log_outage(context.get("request"), dependency, exc)
        return Response(outages.body(dependency), status=status.HTTP_503_SERVICE_UNAVAILABLE,
                        headers=outages.headers(dependency))
    log.exception("unhandled error in %s", context.get("view").__class__.__name__, exc_info=exc)
    return Response(_detail("server_error", _SERVER_ERROR), status=status.HTTP_500_INTERNAL_SERVER_ERROR)


_SERVER_ERROR = "Something went wrong on our side; the error was logged. Please retry or contact an operator."


def _detail(code: str, message: str) -> dict[str, Any]:
    return {"detail": message, "error": error_object(code, message)}


def _client_error(exc: Exception) -> Response | None:
    """Errors Django (or the database driver) raises for a request that was wrong, answered as the 4xx they are."""
    if isinstance(exc, RequestDataTooBig):
        return Response(_detail("too_large", too_big_message(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)),
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, SuspiciousOperation):
        return Response(_detail("invalid", f"The request was refused: {exc}"), status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        field, message = _first_problem(detail)
        return Response({**detail, "error": error_object("invalid", message, field)}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ValueError) and "NUL" in str(exc):  # PostgreSQL text cannot hold \x00 (psycopg refuses it)
        return Response(_detail("invalid", "Text in the request may not contain NUL (\\x00) characters."),
                        status=status.HTTP_400_BAD_REQUEST)
    return None


_NOT_A_FIELD = {"detail", "non_field_errors"}


def _first_problem(data: Any, path: str = "") -> tuple[str | None, str]:
    """(the first field at fault as a dotted path, or None; its first message) in DRF's error data."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "error":
                continue
            field = None if key in _NOT_A_FIELD and not path else f"{path}.{key}" if path else str(key)
            inner, message = _first_problem(value, field or "")
            return inner or field, message
        return (path or None), "The request was refused."
    if isinstance(data, list | tuple):
        for index, item in enumerate(data):
            if item in ({}, [], None):  # DRF lists an empty dict for each item of a list that was fine
                continue
            nested = f"{path}.{index}" if path and isinstance(item, dict) else path
            return _first_problem(item, nested)
        return (path or None), "The request was refused."
    return (path or None), str(data)


#: DRF's codes for what a DomainError calls otherwise: one word per meaning.
_SAME_AS_DOMAIN = {"permission_denied": "forbidden", "parse_error": "invalid"}
#: Django's Http404 and PermissionDenied, which DRF answers without a code.
_DJANGO_CODES = {404: "not_found", 403: "forbidden"}


def _with_error_object(response: Response, exc: Exception) -> Response:
    """DRF's own errors (validation, authentication, throttling, ...) in the one error body."""
    data = response.data
    if isinstance(data, dict) and "error" in data:
        return response
    codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else None
    _, code = _first_problem(codes) if codes is not None else (None, _DJANGO_CODES.get(response.status_code, "error"))
    if isinstance(exc, exceptions.ValidationError):
        code = "invalid"
    code = _SAME_AS_DOMAIN.get(code, code)
    field, message = _first_problem(data)
    if not isinstance(data, dict):  # a bare list of messages: DRF's non-field errors
        data = {"non_field_errors": data}
    response.data = {**data, "error": error_object(code, message, field)}
    return response


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler404``: under ``/api/`` a JSON error (a path no route matches, e.g. a malformed slug), elsewhere the page."""
    if _is_api(request):
        return JsonResponse(_detail("not_found", f"Nothing here: {request.path!r} is no endpoint or object of this API."), status=404)
    return defaults.page_not_found(request, exception)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler400``: a request Django refused before any view (e.g. too many fields), as JSON under ``/api/``."""
    if _is_api(request):
        return JsonResponse(_detail("invalid", f"The request was refused: {exception}"), status=400)
    return defaults.bad_request(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: under ``/api/`` the API's JSON error, elsewhere the page; a dependency that is down (raised
    outside any view, e.g. in a middleware) is the 503 of ``core/outages.py``."""
    outage = outages.outage_response(request, sys.exc_info()[1])  # called while Django handles the exception
    if outage is not None:
        return outage
    if _is_api(request):
        return JsonResponse(_detail("server_error", _SERVER_ERROR), status=500)
    return defaults.server_error(request)


class CursorPages(CursorPagination):
    """Cursor pages for every list endpoint: ``?limit=`` up to 500; subclasses set ``ordering`` (and ``page_size``).

    A cursor that is not one this API handed out is a 400 naming ``cursor``, whether it does not decode or its
    position does not fit the ordering field.
    """

    page_size = 50
    max_page_size = 500
    page_size_query_param = "limit"
    invalid_cursor_message = "Not a cursor this API handed out; follow the next/previous links, or omit cursor for the first page."

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> list[Any] | None:
        self._model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request: Any) -> Any:
        try:
            cursor = super().decode_cursor(request)
        except exceptions.NotFound:
            raise exceptions.ValidationError({self.cursor_query_param: [self.invalid_cursor_message]}) from None
        if cursor is not None and cursor.position is not None and not self._position_fits(cursor.position):
            raise exceptions.ValidationError({self.cursor_query_param: [self.invalid_cursor_message]})
        return cursor

    def _position_fits(self, position: str) -> bool:
        if "\x00" in position:
            return False
        field = self._model._meta.get_field(self.ordering[0].lstrip("-"))
        target = getattr(field, "target_field", None) or field  # a foreign key's position is its target's value
        try:
            value = target.to_python(position)
            target.get_prep_value(value)
            target.run_validators(value)  # e.g. an integer column's range: past it the database refuses the query
        except (DjangoValidationError, ValueError, TypeError, OverflowError):
            return False
        return True
