"""API v1 for the audit trail (read-only): tool calls and configuration changes, newest first, in cursor pages."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, mixins, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from audit.models import ConfigChange, ToolCallAudit, ToolCallStatus
from config.api import CursorPages
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


def _moment(raw: str, name: str) -> dt.datetime | dt.date:
    """An ISO date-time or a date; a wrong form or an impossible value (``2020-13-45``) is a 400 naming the parameter."""
    message = f"Must be an ISO date-time (2024-11-28T14:30:00Z) or a date (2024-11-28); got {raw!r}."
    try:  # parse_* return None for a wrong form and raise ValueError for an impossible value
        value = parse_datetime(raw) or parse_date(raw)
    except ValueError as exc:
        raise exceptions.ValidationError({name: [f"{message} ({exc})"]}) from None
    if value is None:
        raise exceptions.ValidationError({name: [message]})
    return value


def _aware(value: dt.datetime, name: str) -> dt.datetime:
    """In UTC (naive means the server's time zone); out of range (``0001-01-01T00:00+05:00``) is a 400."""
    try:
        return (timezone.make_aware(value) if timezone.is_naive(value) else value).astimezone(dt.UTC)
    except (ValueError, OverflowError) as exc:
        raise exceptions.ValidationError({name: [f"Out of range: {exc}."]}) from None


def time_window(queryset: Any, params: Any) -> Any:
    """``since`` (inclusive; a date from its start) and ``until`` (inclusive; a date to its end)."""
    if params.get("since"):
        since = _moment(params["since"], "since")
        if not isinstance(since, dt.datetime):
            since = dt.datetime.combine(since, dt.time.min)
        queryset = queryset.filter(created_at__gte=_aware(since, "since"))
    if params.get("until"):
        until = _moment(params["until"], "until")
        if isinstance(until, dt.datetime):
            queryset = queryset.filter(created_at__lte=_aware(until, "until"))
        elif until < dt.date.max:  # a date: before the next day starts
            queryset = queryset.filter(created_at__lt=_aware(dt.datetime.combine(until + dt.timedelta(days=1), dt.time.min), "until"))
    return queryset


class _ReadOnlyAudit(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    pagination_class = NewestFirst

    def filter_queryset(self, queryset: Any) -> Any:
        if self.action != "list":
            return queryset
        return self.filter_rows(time_window(queryset, self.request.query_params), self.request.query_params)

    def filter_rows(self, queryset: Any, params: Any) -> Any:
        return queryset


_WINDOW = [
    OpenApiParameter("since", str, description="From this ISO date-time or date on (inclusive)."),
    OpenApiParameter("until", str, description="Up to this ISO date-time, or to the end of this date."),
    OpenApiParameter("limit", int, description="Page size (default 50, at most 500)."),
]


class ToolCallAuditViewSet(_ReadOnlyAudit):
    """``/audit/tool-calls``: one row per tool call, with masked arguments and the hash chain."""

    queryset = ToolCallAudit.objects.select_related("tenant", "agent", "version", "user", "api_key")
    serializer_class = ToolCallAuditSerializer

    @extend_schema(parameters=[
        OpenApiParameter("run", str, description="Only this run's calls (its id)."),
        OpenApiParameter("tool", str, description="Only calls of this tool (its name)."),
        OpenApiParameter("status", str, enum=ToolCallStatus.values, description="Only calls that ended so."),
        OpenApiParameter("agent", str, description="Only calls made by this agent (its slug)."),
        OpenApiParameter("session", str, description="Only this session's calls (its id)."),
        *_WINDOW,
    ])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def filter_rows(self, queryset: Any, params: Any) -> Any:
        for name, field in (("run", "run_id"), ("session", "session_id")):
            if params.get(name):
                try:
                    queryset = queryset.filter(**{field: uuid.UUID(params[name])})
                except ValueError:
                    raise exceptions.ValidationError({name: [f"Must be a {name} id (a UUID); got {params[name]!r}."]}) from None
        if params.get("tool"):
            queryset = queryset.filter(tool_name=params["tool"])
        if params.get("status"):
            if params["status"] not in ToolCallStatus.values:
                message = f"Must be one of {', '.join(ToolCallStatus.values)}; got {params['status']!r}."
                raise exceptions.ValidationError({"status": [message]})
            queryset = queryset.filter(status=params["status"])
        if params.get("agent"):
            queryset = queryset.filter(agent__slug=params["agent"])
        return queryset


class ConfigChangeViewSet(_ReadOnlyAudit):
    """``/audit/changes``: who changed which configuration, written by the service that changed it."""

    queryset = ConfigChange.objects.select_related("tenant", "actor")
    serializer_class = ConfigChangeSerializer

    @extend_schema(parameters=[
        OpenApiParameter("action", str, description="Only this action, e.g. tool.updated; ending in '.' it matches a family (tool.)."),
        OpenApiParameter("target_type", str, description="Only changes to this kind of object, e.g. Tool."),
        OpenApiParameter("target_id", str, description="Only changes to the object with this id."),
        OpenApiParameter("actor", str, description="Only changes made by this user (username)."),
        *_WINDOW,
    ])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def filter_rows(self, queryset: Any, params: Any) -> Any:
        action = params.get("action")
        if action:
            queryset = queryset.filter(action__startswith=action) if action.endswith(".") else queryset.filter(action=action)
        for name in ("target_type", "target_id"):
            if params.get(name):
                queryset = queryset.filter(**{name: params[name]})
        if params.get("actor"):
            queryset = queryset.filter(actor__username=params["actor"])
        return queryset
