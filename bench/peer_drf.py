"""The stock DRF peer of ``bench/api_load.py``: the same three reads as plain ``ModelViewSet`` code over the same tables.

    PYTHONPATH=. uvicorn --app-dir bench peer_drf:app --workers N   # PEER_TENANT_ID and the console's environment

What a Django developer writes from the DRF tutorial: ``ModelSerializer``, a ``ReadOnlyModelViewSet`` with an
``events`` action, token authentication (DRF's ``TokenAuthentication``, keyword ``Bearer``), cursor pagination, DRF's
``JSONRenderer``, Django's default middleware, served by Django's own ASGI handler under uvicorn with as many processes
as the console. The console's figure divided by this one's is what our code costs over stock DRF.
"""

from __future__ import annotations

import os
from typing import Any

os.environ["DJANGO_SETTINGS_MODULE"] = "peer_drf_settings"

from django.core.asgi import get_asgi_application

app = get_asgi_application()

from django.urls import include, path  # noqa: E402
from rest_framework import authentication, pagination, routers, serializers, viewsets  # noqa: E402
from rest_framework.decorators import action  # noqa: E402
from rest_framework.request import Request  # noqa: E402

from agents.models import Run, RunEvent  # noqa: E402

TENANT_ID = int(os.environ.get("PEER_TENANT_ID", "0"))


class BearerTokenAuthentication(authentication.TokenAuthentication):
    keyword = "Bearer"  # DRF's documented way to change the header's keyword


class RunCursor(pagination.CursorPagination):
    ordering = "-created_at"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 200


class EventCursor(RunCursor):
    ordering = "seq"


class RunSerializer(serializers.ModelSerializer):
    class Meta:
        model = Run
        fields = ["id", "status", "terminal_reason", "input", "output", "error", "usage", "step", "last_seq",
                  "cancel_requested", "created_at", "started_at", "finished_at", "needs_attention", "attention_reasons",
                  "attention_resolved_at", "attention_resolution", "session"]


class RunEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["seq", "step", "type", "span_id", "parent_span_id", "payload", "at"]


class RunViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = RunSerializer
    authentication_classes = [BearerTokenAuthentication]
    pagination_class = RunCursor

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return Run.objects.filter(tenant_id=TENANT_ID)

    @action(detail=True)
    def events(self, request: Request, pk: str | None = None) -> Any:
        run = self.get_object()
        after = int(request.query_params.get("after", 0))
        paginator = EventCursor()
        page = paginator.paginate_queryset(RunEvent.objects.filter(run=run, seq__gt=after), request, view=self)
        return paginator.get_paginated_response(RunEventSerializer(page, many=True).data)


router = routers.SimpleRouter(trailing_slash=False)
router.register("runs", RunViewSet, basename="run")
urlpatterns = [path("api/v1/", include(router.urls))]
