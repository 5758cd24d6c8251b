"""API v1 for the audit trail (read-only): tool calls and configuration changes, newest first, in cursor pages."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from audit.filters import ConfigChangeFilter, ToolCallFilter
from audit.models import ConfigChange, ToolCallAudit
from core.api import CursorPages
from core.filters import ListFilterBackend
from tenants.api import TenantScopedViewSet


class NewestFirst(CursorPages):
    ordering = ("-created_at", "-id")


class ToolCallAuditSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    version = serializers.SerializerMethodField()
    user = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    api_key = serializers.SlugRelatedField(slug_field="prefix", read_only=True, allow_null=True)

    class Meta:
        model = ToolCallAudit
        fields = [
            "id", "created_at", "tenant", "run", "agent", "version", "session", "user", "api_key", "step", "call_id",
            "attempt_call_ids", "span_id",
            "tool_name", "arguments_summary", "arguments_hash", "status", "error", "latency_ms", "result_size",
            "idempotency_key", "chain_seq", "prev_hash", "row_hash",
        ]
        read_only_fields = fields

    attempt_call_ids = serializers.ListField(
        child=serializers.CharField(), read_only=True,
        help_text="Every id the model gave this call, first attempt first; the last is the one in the run's message log "
                  "(a step resumed after a crash gets a new id). Join a run's tool messages on tool_call_id in this list. "
                  "Empty on rows written before it was recorded.",
    )

    def get_version(self, row: ToolCallAudit) -> int | None:
        return row.version.number if row.version is not None else None


class ConfigChangeSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    actor = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = ConfigChange
        fields = ["id", "created_at", "tenant", "actor", "action", "target_type", "target_id", "target_repr", "details"]
        read_only_fields = fields


class _ReadOnlyAudit(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    pagination_class = NewestFirst
    filter_backends = [ListFilterBackend]


_WINDOW = [OpenApiParameter("limit", int, description="Page size (default 50, at most 500).")]


class ToolCallAuditViewSet(_ReadOnlyAudit):
    """``/audit/tool-calls``: one row per tool call, with masked arguments and the hash chain."""

    queryset = ToolCallAudit.objects.select_related("tenant", "agent", "version", "user", "api_key")
    serializer_class = ToolCallAuditSerializer
    filterset_class = ToolCallFilter

    @extend_schema(parameters=_WINDOW)
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)



class ConfigChangeViewSet(_ReadOnlyAudit):
    """``/audit/changes``: who changed which configuration, written by the service that changed it."""

    queryset = ConfigChange.objects.select_related("tenant", "actor")
    serializer_class = ConfigChangeSerializer
    filterset_class = ConfigChangeFilter

    @extend_schema(parameters=_WINDOW)
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

