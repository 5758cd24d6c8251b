"""API-wide error shape: every error says what was wrong and what is expected; never a bare 500."""

from __future__ import annotations

import logging
from typing import Any

from rest_framework import status
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

log = logging.getLogger(__name__)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_exception_handler(exc, context)
    if response is None:
        log.exception("unhandled error in %s", context.get("view").__class__.__name__, exc_info=exc)
        return Response(
            {"detail": "Something went wrong on our side; the error was logged. Please retry or contact an operator."},
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    return response


class CursorPages(CursorPagination):
    """Cursor pages for every list endpoint: ``?limit=`` up to 500; subclasses set ``ordering`` (and ``page_size``)."""

    page_size = 50
    max_page_size = 500
    page_size_query_param = "limit"
