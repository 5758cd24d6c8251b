"""``/api/v1/approvals``: for client apps that build their own approval UI."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from approvals import decisions
from approvals.filters import ApprovalFilter
from approvals.models import ApprovalRequest
from core.api import CursorPages
from core.filters import ListFilterBackend
from tenants.api import TenantScopedViewSet


class ApprovalSerializer(serializers.ModelSerializer):
    agent = serializers.CharField(source="run.agent.slug", read_only=True)
    question = serializers.CharField(source="run.input", read_only=True)
    decisions = serializers.SerializerMethodField()

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
            "status",
            "tool_name",
            "agent",
            "run",
            "step",
            "call_id",
            "question",
            "preview",
            "arguments_hash",
            "edited_hash",
            "required_approvals",
            "requested_at",
            "expires_at",
            "decided_at",
            "decisions",
        ]
        read_only_fields = fields

    def get_decisions(self, request: ApprovalRequest) -> list[dict[str, Any]]:
        return [
            {"user": d.user.get_username() if d.user else None, "approved": d.approved, "note": d.note, "at": d.at,
             "edited": d.edited, "arguments_hash": d.arguments_hash}
            for d in request.decisions.all()
        ]


class DecisionSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")
    arguments = serializers.JSONField(
        required=False, default=None,
        help_text='Approve only: the fields to change before approving, merged over the call\'s arguments, e.g. {"amount": "30.00"}. '
                  "Validated against the tool's parameter schema; the call then runs with the edited arguments.")
    arguments_hash = serializers.RegexField(
        r"^[0-9a-f]{64}$", required=False, default="",
        help_text="The hash of the arguments you reviewed (edited_hash, else arguments_hash); refused with 409 if they changed.")


class OldestFirst(CursorPages):
    ordering = "requested_at"
    max_page_size = 200


class ApprovalViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = ApprovalRequest.objects.select_related("run", "run__agent").prefetch_related("decisions__user")
    serializer_class = ApprovalSerializer
    pagination_class = OldestFirst
    scope_actions = {"list": "review", "retrieve": "review", "approve": "review", "reject": "review"}
    filter_backends = [ListFilterBackend]
    filterset_class = ApprovalFilter

    def get_queryset(self) -> Any:
        return self.queryset.for_actor(self.actor, "review")

    def _decide(self, request: Request, pk: Any, approve: bool) -> Response:
        body = DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        self.get_object()  # 404 for a foreign or unknown request
        data = body.validated_data
        decided = decisions.decide(actor=self.actor, request_id=pk, approve=approve, note=data["note"], via="api",
                                   arguments=data["arguments"], seen_hash=data["arguments_hash"])
        return Response(ApprovalSerializer(decided).data, status=status.HTTP_200_OK)

    @extend_schema(request=DecisionSerializer, responses={200: ApprovalSerializer, 400: None, 403: None, 409: None})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: Any = None) -> Response:
        return self._decide(request, pk, True)

    @extend_schema(request=DecisionSerializer, responses={200: ApprovalSerializer, 403: None, 409: None})
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: Any = None) -> Response:
        return self._decide(request, pk, False)
