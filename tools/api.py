"""API v1 for tools: CRUD for operators, a dry run of arguments, and MCP imports. Thin: parse, authorise, call a service."""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from core.api import CursorPages
from core.filters import ListFilterBackend
from core.numbers import whole_number
from tenants.api import TenantScopedViewSet
from tools import handlers, kinds, services
from tools.arguments import parse_arguments
from tools.executors import ToolFailure
from tools.filters import ToolFilter
from tools.http_exec import HttpToolError
from tools.kinds.base import Kind
from tools.models import Tool
from tools.serializers import (
    DryRunSerializer,
    McpImportSerializer,
    PreviewImpactResultSerializer,
    PreviewImpactSerializer,
    ToolSerializer,
)


class ToolsByName(CursorPages):
    ordering = ("tenant_id", "name")
    page_size = 100


class ToolViewSet(mixins.ListModelMixin, TenantScopedViewSet):
    """``/tools[/<name or id>]``: a tool is addressed by its name (or its numeric id)."""

    queryset = Tool.objects.select_related("tenant", "plugin_install").order_by("tenant_id", "name")
    serializer_class = ToolSerializer
    filter_backends = [ListFilterBackend]
    filterset_class = ToolFilter
    pagination_class = ToolsByName
    lookup_value_regex = "[^/]+"
    scope_actions = {**TenantScopedViewSet.scope_actions, "dry_run": "view", "import_mcp": "operate",
                     "preview_impact": "operate"}

    def get_object(self) -> Tool:
        ref = str(self.kwargs["pk"])
        number = whole_number(ref)  # a name, or an id ("²" is a digit to isdigit(), and int() refuses it)
        match = Q(name=ref) | Q(pk=number) if number is not None else Q(name=ref)
        candidates = self.get_queryset().filter(match)
        tenant = self.request.headers.get("X-Tenant")
        if tenant:
            candidates = candidates.filter(tenant__slug=tenant)
        found = list(candidates[:3])
        by_name = [t for t in found if t.name == ref]
        found = by_name or found
        if not found:
            raise exceptions.NotFound(f"No tool {ref!r} here.")
        if len(found) > 1:
            raise exceptions.ValidationError({"X-Tenant": ["Several of your tenants have this tool; name one with the X-Tenant header."]})
        self.check_object_permissions(self.request, found[0])
        return found[0]

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(ToolSerializer(self.get_object()).data)

    @extend_schema(request=ToolSerializer, responses={201: ToolSerializer})
    def create(self, request: Request) -> Response:
        tenant = self.acting_tenant("operate")
        body = ToolSerializer(data=request.data, context={"tenant": tenant})
        body.is_valid(raise_exception=True)
        tool = services.create_tool(tenant=tenant, actor=self.actor, **body.validated_data)
        return Response(ToolSerializer(tool).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ToolSerializer, responses={200: ToolSerializer})
    def update(self, request: Request, pk: str, partial: bool = False) -> Response:
        tool = self.get_object()
        body = ToolSerializer(tool, data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        tool = services.update_tool(tool=tool, actor=self.actor, **body.validated_data)
        return Response(ToolSerializer(tool).data)

    def partial_update(self, request: Request, pk: str) -> Response:
        return self.update(request, pk, partial=True)

    @extend_schema(responses={204: None, 409: None})
    def destroy(self, request: Request, pk: str) -> Response:
        services.delete_tool(tool=self.get_object(), actor=self.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=DryRunSerializer,
        responses={200: inline_serializer("DryRunResult", {
            "ok": serializers.BooleanField(), "tool": serializers.CharField(), "arguments": serializers.JSONField(),
            "repaired": serializers.BooleanField(), "repairs": serializers.ListField(child=serializers.CharField()),
            "mapped": serializers.ListField(child=serializers.ListField(child=serializers.CharField())),
            "errors": serializers.ListField(child=serializers.DictField()), "model_message": serializers.CharField(),
        })},
    )
    @action(detail=True, methods=["post"], url_path="dry-run")
    def dry_run(self, request: Request, pk: str) -> Response:
        """Check arguments against the tool exactly as the gateway would, without running it."""
        tool = self.get_object()
        body = DryRunSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        parsed = parse_arguments(body.validated_data["arguments"], tool.parameters or {"type": "object", "properties": {}},
                                 tool_name=tool.name)
        result: dict[str, Any] = {
            "ok": parsed.ok, "tool": tool.name, "arguments": parsed.arguments if parsed.ok else None,
            "repaired": parsed.repaired, "repairs": parsed.repairs, "mapped": [list(m) for m in parsed.mapped],
            "errors": [{"field": p.field, "expected": p.expected, "received": p.received, "message": p.message} for p in parsed.errors],
            "model_message": parsed.model_message,
        }
        kind = kinds.kind_for(tool.kind)
        if parsed.ok and kind is not None and kind.request_preview is not None:
            result["request"] = _request_preview(kind, tool, parsed.arguments)
        return Response(result)

    @extend_schema(request=PreviewImpactSerializer, responses={200: PreviewImpactResultSerializer})
    @action(detail=True, methods=["post"], url_path="preview-impact")
    def preview_impact(self, request: Request, pk: str) -> Response:
        """What a proposed, unsaved policy change (kill switch, scopes, approval, rate limit) would have done to the
        tool's recorded calls of the last ``days`` (1 to 30): calls newly denied, needing approval, rate limited or
        allowed, by tenant, agent and tool, with masked examples. Refused exactly as saving it would be; saves nothing."""
        tool = self.get_object()
        body = PreviewImpactSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        preview = handlers.agents.preview_tool_impact
        if preview is None:
            raise exceptions.APIException("The impact preview is not available.")
        data = dict(body.validated_data)
        days = data.pop("days", None)
        return Response(preview(tool=tool, actor=self.actor, fields=data, days=days))

    @extend_schema(request=McpImportSerializer, responses={201: inline_serializer("McpImportReport", {
        "created": serializers.ListField(child=serializers.CharField()),
        "updated": serializers.ListField(child=serializers.CharField()),
        "skipped": serializers.ListField(child=serializers.DictField()),
        "stale": serializers.ListField(child=serializers.CharField()),
    })})
    @action(detail=False, methods=["post"], url_path="import-mcp")
    def import_mcp(self, request: Request) -> Response:
        """Import (or refresh) the tools of an MCP server as tools of kind ``mcp``."""
        from tools.mcp_import import McpServerError, import_mcp_tools

        tenant = self.acting_tenant("operate")
        body = McpImportSerializer(data=request.data, context={"tenant": tenant})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            report = import_mcp_tools(tenant, data["server"], self.actor, prefix=data["prefix"],
                                      only=data.get("tools"))
        except McpServerError as exc:
            raise serializers.ValidationError({"server": [str(exc)]}) from None
        return Response(report.as_dict(), status=status.HTTP_201_CREATED)


def _request_preview(kind: Kind, tool: Tool, arguments: dict[str, Any]) -> dict[str, Any] | str:
    """The request the call would send (secrets not resolved), or why it could not be built."""
    assert kind.request_preview is not None
    try:
        return kind.request_preview(tool, arguments, tool.sensitive_fields or ())
    except (HttpToolError, ValueError, ToolFailure) as exc:  # ToolFailure: a stored config that no longer parses
        return f"the request could not be built: {exc}"
