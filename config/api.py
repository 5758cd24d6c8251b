"""API-wide error shape: every error says what was wrong and what is expected; never a bare 500 (an outage is a 503)."""

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

from config import outages
from config.parsers import too_big_message

log = logging.getLogger(__name__)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    known = _client_error(exc)
    if known is not None:
        return known
    dependency = outages.dependency_down(exc)
    if dependency is not None:  # the database or Redis is down: a 503 the client retries, not a 500
        outages.log_outage(context.get("request"), dependency, exc)
        return Response(outages.body(dependency), status=status.HTTP_503_SERVICE_UNAVAILABLE, headers=outages.headers())
    log.exception("unhandled error in %s", context.get("view").__class__.__name__, exc_info=exc)
    return Response(
        {"detail": "Something went wrong on our side; the error was logged. Please retry or contact an operator."},
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def _client_error(exc: Exception) -> Response | None:
    """Errors Django (or the database driver) raises for a request that was wrong, answered as the 4xx they are."""
    if isinstance(exc, RequestDataTooBig):
        return Response({"detail": too_big_message(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)},
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, SuspiciousOperation):
        return Response({"detail": f"The request was refused: {exc}"}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        return Response(detail, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ValueError) and "NUL" in str(exc):  # PostgreSQL text cannot hold \x00 (psycopg refuses it)
        return Response({"detail": "Text in the request may not contain NUL (\\x00) characters."}, status=status.HTTP_400_BAD_REQUEST)
    return None


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler404``: under ``/api/`` a JSON error (a path no route matches, e.g. a malformed slug), elsewhere the page."""
    if _is_api(request):
        return JsonResponse({"detail": f"Nothing here: {request.path!r} is no endpoint or object of this API."}, status=404)
    return defaults.page_not_found(request, exception)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler400``: a request Django refused before any view (e.g. too many fields), as JSON under ``/api/``."""
    if _is_api(request):
        return JsonResponse({"detail": f"The request was refused: {exception}"}, status=400)
    return defaults.bad_request(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: under ``/api/`` the API's JSON error, elsewhere the page; a dependency that is down (raised
    outside any view, e.g. in a middleware) is the 503 of ``config/outages.py``."""
    outage = outages.outage_response(request, sys.exc_info()[1])  # called while Django handles the exception
    if outage is not None:
        return outage
    if _is_api(request):
        return JsonResponse({"detail": "Something went wrong on our side; the error was logged. Please retry or contact an operator."},
                            status=500)
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
        try:
            field.get_prep_value(field.to_python(position))
        except (DjangoValidationError, ValueError, TypeError, OverflowError):
            return False
        return True
