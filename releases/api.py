"""``/api/v1/evaluation-sets`` and ``/api/v1/replays``. Thin: parse, authorise, call ``releases.services``."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from agents.models import Agent, AgentVersion
from core.api import CursorPages
from core.errors import Invalid
from releases import services
from releases.models import BatchStatus, EvaluationSet, MissPolicy, ModelMode, ReplayBatch
from tenants.api import TenantScopedViewSet


class EvaluationSetSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    agent = serializers.SlugField(max_length=64, help_text="The slug of the agent whose runs the set holds.")
    filters = serializers.JSONField(required=False, help_text="versions, created_after, created_before, terminal_reason, "
                                                                "status (finished only), limit (default 100), playground. "
                                                                "Or give run_ids.")
    run_ids = serializers.ListField(child=serializers.CharField(max_length=64), required=False, write_only=True,
                                    max_length=services.MAX_SET_RUNS, help_text="Runs picked by hand.")
    runs = serializers.SerializerMethodField()

    class Meta:
        model = EvaluationSet
        fields = ["id", "tenant", "name", "description", "agent", "filters", "run_ids", "runs", "created_at"]
        read_only_fields = ["id", "tenant", "runs", "created_at"]

    def get_runs(self, row: EvaluationSet) -> int:
        return row.members.count()

    def to_representation(self, row: EvaluationSet) -> dict[str, Any]:
        data = super().to_representation(row)
        data["agent"] = row.agent.slug
        return data


class CandidateSerializer(serializers.Serializer):
    agent = serializers.SlugField(max_length=64)
    version = serializers.IntegerField(min_value=1)


class ReplaySerializer(serializers.Serializer):
    evaluation_set = serializers.IntegerField(min_value=1)
    candidate = CandidateSerializer()
    model_mode = serializers.ChoiceField(choices=ModelMode.choices, default=ModelMode.RECORDED)
    miss_policy = serializers.ChoiceField(choices=MissPolicy.choices, default=MissPolicy.STOP)
    checks = serializers.JSONField(required=False)
    cost_cap = serializers.DecimalField(max_digits=12, decimal_places=6, required=False, allow_null=True)
    concurrency = serializers.IntegerField(required=False, min_value=1, max_value=services.MAX_CONCURRENCY)


class ReplayResultSerializer(serializers.Serializer):
    """One replayed run beside its recording (documentation of ``batch_report``'s results)."""

    source_run = serializers.CharField(help_text="The recorded run's id.")
    status = serializers.CharField(help_text="replayed | error | skipped (erased, unfinished, a flow run, past the cost cap).")
    passed = serializers.BooleanField(allow_null=True)
    regression = serializers.BooleanField()
    changed = serializers.ListField(child=serializers.CharField(), help_text="What differs from the recording: "
                                    "tools, approvals, terminal_reason, answer, steps, tokens, cost.")
    checks = serializers.ListField(child=serializers.DictField(), help_text="Each check with its 'passed'.")
    diff = serializers.DictField(help_text="Per aspect {recorded, replayed, same}; answer.diff: a unified text diff; "
                                 "approvals.new; misses: calls the recording did not hold.")
    live_tool_calls = serializers.IntegerField()
    tokens = serializers.IntegerField()
    cost = serializers.CharField()
    latency_ms = serializers.FloatField()
    error = serializers.CharField(allow_null=True)


class ReplayReportSerializer(serializers.Serializer):
    """A batch's progress and report (``releases.services.batch_report``): regressions first."""

    id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=BatchStatus.choices)
    evaluation_set = serializers.IntegerField()
    candidate = CandidateSerializer()
    model_mode = serializers.ChoiceField(choices=ModelMode.choices)
    miss_policy = serializers.ChoiceField(choices=MissPolicy.choices)
    checks = serializers.ListField(child=serializers.DictField())
    total = serializers.IntegerField()
    done = serializers.IntegerField()
    passed = serializers.IntegerField()
    failed = serializers.IntegerField()
    skipped = serializers.IntegerField()
    pass_rate = serializers.FloatField(allow_null=True)
    cost_cap = serializers.CharField(allow_null=True)
    cost_spent = serializers.CharField()
    changed = serializers.DictField(child=serializers.IntegerField(), help_text="aspect -> how many runs differ in it")
    error = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    results = ReplayResultSerializer(many=True, help_text="Empty in the list; up to 200 in a batch's own report.")


class ByName(CursorPages):
    ordering = ("tenant_id", "name")
    page_size = 100


class Newest(CursorPages):
    ordering = ("-created_at",)
    page_size = 50


class EvaluationSetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = EvaluationSet.objects.select_related("tenant", "agent").order_by("tenant_id", "name")
    serializer_class = EvaluationSetSerializer
    pagination_class = ByName

    @extend_schema(request=EvaluationSetSerializer, responses={201: EvaluationSetSerializer})
    def create(self, request: Request) -> Response:
        tenant = self.acting_tenant("operate")
        body = EvaluationSetSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        agent = Agent.objects.filter(tenant=tenant, slug=data["agent"]).first()
        if agent is None:
            raise Invalid(f"there is no agent {data['agent']!r} in this tenant.", field="agent")
        filters = data.get("filters")
        if filters is not None and not isinstance(filters, dict):
            raise Invalid("filters must be an object like {\"versions\": [1], \"limit\": 100}.", field="filters")
        row = services.create_evaluation_set(tenant=tenant, actor=self.actor, name=data["name"], agent=agent,
                                             filters=filters, run_ids=data.get("run_ids"),
                                             description=data.get("description", ""))
        return Response(EvaluationSetSerializer(row).data, status=status.HTTP_201_CREATED)


class ReplayViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = ReplayBatch.objects.select_related("tenant", "candidate__agent", "evaluation_set").order_by("-created_at")
    pagination_class = Newest
    serializer_class = ReplaySerializer

    @extend_schema(responses={200: ReplayReportSerializer(many=True)})
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response([services.batch_report(b, limit=0) for b in page or []])

    @extend_schema(responses={200: ReplayReportSerializer})
    def retrieve(self, request: Request, pk: Any = None) -> Response:
        return Response(services.batch_report(self.get_object()))

    @extend_schema(request=None, responses={200: ReplayReportSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: Any = None) -> Response:
        """Cancel a queued or running replay: no further runs are replayed; those done stay in the report."""
        batch = self.get_object()  # another tenant's: 404
        batch = services.cancel_replay(tenant=batch.tenant, actor=self.actor, batch=batch)
        return Response(services.batch_report(batch))

    @extend_schema(request=ReplaySerializer, responses={202: ReplayReportSerializer})
    def create(self, request: Request) -> Response:
        tenant = self.acting_tenant("operate")
        body = ReplaySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        evaluation_set = EvaluationSet.objects.filter(tenant=tenant, pk=data["evaluation_set"]).select_related("agent").first()
        if evaluation_set is None:
            raise Invalid("there is no such evaluation set in this tenant.", field="evaluation_set")
        candidate = AgentVersion.objects.filter(tenant=tenant, agent__slug=data["candidate"]["agent"],
                                                number=data["candidate"]["version"]).select_related("agent", "tenant").first()
        if candidate is None:
            raise Invalid(f"there is no version {data['candidate']['version']} of {data['candidate']['agent']!r} in this tenant.",
                          field="candidate")
        batch = services.start_replay(tenant=tenant, actor=self.actor, evaluation_set=evaluation_set, candidate=candidate,
                                      model_mode=data["model_mode"], miss_policy=data["miss_policy"],
                                      checks=data.get("checks"), cost_cap=data.get("cost_cap"),
                                      concurrency=data.get("concurrency"))
        return Response(services.batch_report(batch), status=status.HTTP_202_ACCEPTED)
