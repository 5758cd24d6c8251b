"""API v1 for sessions: ``/api/v1/sessions`` (list, detail with turns, usage and runs) and their erasure (``DELETE``).

Thin like the runs API: the base viewset decides tenancy (a foreign session is a 404), one service erases
(``agents.erasure.erase_session``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, inline_serializer
from rest_framework import exceptions, mixins, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from agents.api import NewestFirst
from agents.erasure import ERASE_ACTION, erase_session
from agents.filters import SessionFilter
from agents.models import Run, Session, Turn
from core.filters import ListFilterBackend
from tenants.api import TenantScopedViewSet

#: A session's detail lists at most this many of its turns and of its runs (the latest); the counts say how many in all.
DETAIL_MAX = 500


def _base(context: dict[str, Any]) -> str:
    request = context.get("request")
    return request.build_absolute_uri("/") if request is not None else "/"


class SessionRunSerializer(serializers.ModelSerializer):
    links = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = ["id", "status", "terminal_reason", "created_at", "finished_at", "links"]
        read_only_fields = fields

    def get_links(self, run: Run) -> dict[str, str]:
        base = _base(self.context)
        ws_base = base.replace("https://", "wss://").replace("http://", "ws://")
        return {"self": f"{base}api/v1/runs/{run.pk}", "events": f"{base}api/v1/runs/{run.pk}/events", "ws": f"{ws_base}ws/runs/{run.pk}/"}


class TurnSerializer(serializers.ModelSerializer):
    seq = serializers.IntegerField(source="turn_seq", read_only=True)
    run = serializers.UUIDField(source="run_id", read_only=True)
    input = serializers.CharField(source="user_message", read_only=True, help_text="The user's message (masked as stored).")
    output = serializers.CharField(source="assistant_message", read_only=True, help_text="The agent's answer.")

    class Meta:
        model = Turn
        fields = ["seq", "run", "input", "output", "created_at"]
        read_only_fields = fields


class SessionSerializer(serializers.ModelSerializer):
    agent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    turn_count = serializers.IntegerField(source="turns", read_only=True, help_text="Finished exchanges, erased ones included.")
    run_count = serializers.SerializerMethodField()
    erased = serializers.SerializerMethodField(help_text="True once its inputs, messages and outputs were erased.")
    erased_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    links = serializers.SerializerMethodField()

    class Meta:
        model = Session
        fields = ["id", "agent", "created_at", "updated_at", "turn_count", "run_count", "model_calls", "usage",
                  "erased", "erased_at", "erased_by", "links"]
        read_only_fields = fields

    def get_run_count(self, session: Session) -> int:
        annotated = getattr(session, "run_count", None)
        return int(annotated) if annotated is not None else session.runs.count()

    def get_erased(self, session: Session) -> bool:
        return session.erased_at is not None

    def get_links(self, session: Session) -> dict[str, str]:
        return {"self": f"{_base(self.context)}api/v1/sessions/{session.pk}"}


class SessionDetailSerializer(SessionSerializer):
    turns = serializers.SerializerMethodField(
        help_text=f"The exchanges, oldest first (at most the latest {DETAIL_MAX}); empty once erased.")
    runs = serializers.SerializerMethodField(help_text=f"Its runs, oldest first (at most the latest {DETAIL_MAX}).")

    class Meta(SessionSerializer.Meta):
        fields = [*SessionSerializer.Meta.fields, "turns", "runs"]
        read_only_fields = fields

    @extend_schema_field(TurnSerializer(many=True))
    def get_turns(self, session: Session) -> list[dict[str, Any]]:
        rows = list(Turn.objects.filter(session=session).order_by("-turn_seq")[:DETAIL_MAX])[::-1]
        return TurnSerializer(rows, many=True, context=self.context).data  # type: ignore[return-value]

    @extend_schema_field(SessionRunSerializer(many=True))
    def get_runs(self, session: Session) -> list[dict[str, Any]]:
        rows = list(Run.objects.filter(session=session).order_by("-created_at")[:DETAIL_MAX])[::-1]
        return SessionRunSerializer(rows, many=True, context=self.context).data  # type: ignore[return-value]




@extend_schema(tags=["sessions"])
class SessionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """A session is a conversation: its runs share history. Readable with ``view``; erasable by the tenant's owner."""

    queryset = Session.objects.select_related("agent", "erased_by")
    serializer_class = SessionSerializer
    pagination_class = NewestFirst
    lookup_value_regex = "[0-9a-fA-F-]{32,36}"
    # DELETE needs ``own`` (see agents.erasure.ERASE_ACTION): erasing is irreversible and removes the record of what
    # runs did, so it is the tenant owner's decision (a data controller's), not an operator's.
    scope_actions = {**TenantScopedViewSet.scope_actions, "destroy": ERASE_ACTION}
    filter_backends = [ListFilterBackend]
    filterset_class = SessionFilter

    def get_queryset(self) -> Any:
        queryset = super().get_queryset()
        if self.action == "list":
            queryset = queryset.annotate(run_count=Count("runs"))
        return queryset

    def get_serializer_class(self) -> Any:
        return SessionDetailSerializer if self.action == "retrieve" else SessionSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter("agent", str, description="Only sessions of this agent (its slug)."),
            OpenApiParameter("erased", bool, description="true: only erased sessions; false: only sessions not erased."),
            OpenApiParameter("limit", int, description="Page size, at most 200 (default 50)."),
        ],
        responses={200: SessionSerializer(many=True)},
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The tenant's sessions, newest first, in cursor pages (follow ``next``)."""
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: SessionDetailSerializer})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The session with its turns (each exchange's input and output), usage, model calls and runs."""
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(
        parameters=[OpenApiParameter(
            "reason", str, description="Why (e.g. the ticket of the data-subject request), kept in the audit tombstone; "
                                       "at most 300 characters, masked. Put no personal data here.")],
        request=None,
        responses={204: None, 409: inline_serializer("SessionErasureConflict", {"detail": serializers.CharField()})},
    )
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Erase the session's stored inputs, messages and outputs (a data-subject request); the audit keeps a tombstone.

        Runs stay (status, usage, times) with their input, output, error and facts blank; their messages, trace events
        and the session's turns are deleted; approval requests lose their arguments, edited arguments and preview, their
        decisions the approvers' notes; flow runs' node rows lose their inputs, outputs and errors; replay results of the
        runs lose their diffs. Tool-call audit rows and the chained approval decisions are kept (append-only,
        hash-chained, masked summaries). Sessions that this session's agent tools started are erased
        with it. One ``session.erased`` configuration change records who, when and the counts, never the content.
        Needs the tenant's owner role. 409 while a run of the session is active: cancel it first. Erasing an erased
        session answers 204 again and records nothing new. No new run may join an erased session.
        """
        session = self.get_object()
        reason = request.query_params.get("reason", "")
        if len(reason) > 300:
            raise exceptions.ValidationError({"reason": [f"At most 300 characters; got {len(reason)}."]})
        erase_session(actor=self.actor, session=session, reason=reason, via="api")
        return Response(status=status.HTTP_204_NO_CONTENT)

