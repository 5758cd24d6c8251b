"""API v1 for runs and agents. Thin: parse, authorise (the base viewset), call one service, render."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import Exists, OuterRef
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    inline_serializer,
)
from rest_framework import exceptions, mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response

from agents import acceptance, attention, services, shadow, sse
from agents.filters import RunFilter
from agents.models import Agent, AgentKind, AgentVersion, Run, RunEvent, Session
from agents.serializers import (
    RUN_READ_FIELDS,
    AgentCreateSerializer,
    AgentSerializer,
    AgentVersionSerializer,
    AgentVersionWriteSerializer,
    FlowRunCreateSerializer,
    ResolveAttentionSerializer,
    RunCreateSerializer,
    RunEventSerializer,
    RunSerializer,
    VersionPreviewSerializer,
)
from core.api import CursorPages
from core.filters import ListFilterBackend
from tenants import open_streams
from tenants.api import TenantScopedViewSet
from tools.serializers import PreviewImpactResultSerializer

EVENTS_PAGE_MAX = 500


class NewestFirst(CursorPages):
    ordering = "-created_at"
    max_page_size = 200


class StreamNegotiation(DefaultContentNegotiation):
    """``Accept: text/event-stream`` is acceptable on runs: the streams answer it, and everything else (errors too) is JSON.

    (Not a renderer: a second renderer format would add a ``format`` query parameter to every run endpoint.)
    """

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except exceptions.NotAcceptable:
            if not wants_event_stream(request):
                raise
            return renderers[0], renderers[0].media_type


def wants_event_stream(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "")


class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    content_negotiation_class = StreamNegotiation
    queryset = Run.objects.select_related("agent", "version", "attention_resolved_by")
    serializer_class = RunSerializer
    pagination_class = NewestFirst
    scope_actions = {**TenantScopedViewSet.scope_actions, "cancel": "operate", "events": "view", "stream": "view",
                     "resolve_attention": attention.RESOLVE_ACTION}
    throttle_scopes = {"create": "run_create"}  # RUN_CREATE_THROTTLE_RATE per key, on top of the API-wide rate
    filter_backends = [ListFilterBackend]
    filterset_class = RunFilter
    #: Reads load only what they show (RUN_READ_FIELDS), never a run's state (its whole conversation).
    lean_actions = frozenset({"list", "retrieve", "events", "stream"})

    def get_queryset(self) -> Any:
        queryset = super().get_queryset()
        return queryset.only(*RUN_READ_FIELDS) if self.action in self.lean_actions else queryset

    @extend_schema(
        request=PolymorphicProxySerializer("RunOrFlowRunCreate", [RunCreateSerializer, FlowRunCreateSerializer],
                                           resource_type_field_name=None),
        description=("Start an agent's run ({\"agent\", \"input\": text}) or a flow's run ({\"flow\", \"input\": "
                     "object}); both are runs, answered the same way."),
        parameters=[
            OpenApiParameter(
                acceptance.IDEMPOTENCY_HEADER, acceptance.KEY_SCHEMA, OpenApiParameter.HEADER, required=False,
                description=(f"A key of yours for this request ({acceptance.KEY_RULE}), sent again on every retry of it. "
                             "Per tenant, kept with the run. The same key with the same body returns the run it created "
                             f"({acceptance.REPLAYED_HEADER}: true), even for requests that race; with a different "
                             "body it is a 422. Without it, a retry after a lost answer may create a second run."),
            ),
            OpenApiParameter(acceptance.REPLAYED_HEADER, str, OpenApiParameter.HEADER, response=[202], enum=["true"],
                             description="Present when an earlier request with this Idempotency-Key created the run."),
        ],
        responses={
            202: OpenApiResponse(RunSerializer, description=(
                "The run is accepted (its row is committed) and will run; if the queue was unreachable, the sweeper "
                "enqueues it within SWEEP_QUEUED_AFTER_SECONDS. Never create it again.")),
            422: OpenApiResponse(description="The Idempotency-Key was first used with a different request body."),
        },
    )
    def create(self, request: Request) -> Response:
        try:
            key = acceptance.parse_key(request.headers.get(acceptance.IDEMPOTENCY_HEADER))
        except acceptance.KeyInvalid as exc:
            raise serializers.ValidationError({acceptance.IDEMPOTENCY_HEADER: [str(exc)]}) from None
        if isinstance(request.data, dict) and "flow" in request.data:
            if "agent" in request.data:
                raise serializers.ValidationError({"flow": ['Give "agent" (an agent\'s run, "input" a message) or '
                                                            '"flow" (a flow run, "input" a JSON object), not both.']})
            return self._create_flow_run(request, key)
        body = RunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        tenant = self.acting_tenant("operate")
        # With what start_run reads of it (the tenant's settings, the current version): no lazy query per create.
        agent = Agent.objects.for_tenant(tenant.pk).select_related("tenant", "current_version").filter(
            slug=data["agent"]).first()  # the acting tenant was checked for "operate" above
        if agent is None or agent.kind != AgentKind.AGENT:
            agents = Agent.objects.for_tenant(tenant).filter(kind=AgentKind.AGENT)
            known = ", ".join(agents.values_list("slug", flat=True)[:20]) or "none"
            message = f"No agent {data['agent']!r} in tenant {tenant.slug!r}. Known agents: {known}."
            if agent is not None:
                message = (f"{data['agent']!r} is a flow: start it with {{\"flow\": \"{data['agent']}\", \"input\": "
                           f"{{...}}}} (a JSON object) instead of \"agent\". Known agents: {known}.")
            raise serializers.ValidationError({"agent": [message]})
        session = None
        if data.get("session"):
            session = Session.objects.for_actor(self.actor).for_tenant(tenant).filter(pk=data["session"]).first()
            if session is None:
                message = f"No session {data['session']} in this tenant. Omit the field to start a new one."
                raise serializers.ValidationError({"session": [message]})
        streams = bool(data.get("stream") or wants_event_stream(request))
        slot = _stream_slot(self.actor, tenant.pk) if streams else None  # refused before any run is created
        # A run created to be streamed is enqueued by its stream once that has joined the run's feed: the first delta
        # cannot be published before the client listens (deltas are not stored).
        try:
            accepted = acceptance.accept_run(actor=self.actor, agent=agent, text=data["input"], session=session,
                                             facts=data.get("facts"), idempotency_key=key, enqueue=not streams)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        headers = {acceptance.REPLAYED_HEADER: "true"} if accepted.replayed else {}
        if streams:
            headers["Location"] = f"/api/v1/runs/{accepted.run.pk}"
            headers["X-Run-Id"] = str(accepted.run.pk)
            run_id = accepted.run.pk
            start = None if accepted.replayed else sse.Once(lambda: acceptance.deliver(run_id))
            return sse.stream_response(run_id, 0, status=status.HTTP_202_ACCEPTED, headers=headers, on_joined=start,
                                       slot=slot)
        return Response(RunSerializer(accepted.run, context={"request": request}).data, status=status.HTTP_202_ACCEPTED,
                        headers=headers)

    def _create_flow_run(self, request: Request, key: str) -> Response:
        """``{"flow": slug, "input": {...}}``: a flow run, accepted like an agent's run (key, release, admission)."""
        body = FlowRunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        tenant = self.acting_tenant("operate")
        flow = Agent.objects.for_actor(self.actor, "operate").for_tenant(tenant).select_related(
            "tenant", "current_version").filter(slug=data["flow"], kind=AgentKind.FLOW).first()
        if flow is None:
            known = ", ".join(Agent.objects.for_tenant(tenant).filter(kind=AgentKind.FLOW).values_list("slug", flat=True)[:20])
            raise serializers.ValidationError({"flow": [f"No flow {data['flow']!r} in tenant {tenant.slug!r}. "
                                                        f"Known flows: {known or 'none'}."]})
        text = json.dumps(data["input"], sort_keys=True, ensure_ascii=False, default=str)
        accepted = acceptance.accept_run(actor=self.actor, agent=flow, text=text, facts=data.get("facts"),
                                         idempotency_key=key)
        headers = {acceptance.REPLAYED_HEADER: "true"} if accepted.replayed else {}
        return Response(RunSerializer(accepted.run, context={"request": request}).data, status=status.HTTP_202_ACCEPTED,
                        headers=headers)

    @extend_schema(
        parameters=[
            OpenApiParameter("after", int, description="Return events with seq greater than this (default 0)."),
            OpenApiParameter("limit", int, description=f"Page size, at most {EVENTS_PAGE_MAX} (default 100)."),
        ],
        responses={200: inline_serializer("RunEventPage", {
            "run": serializers.UUIDField(), "status": serializers.CharField(), "events": RunEventSerializer(many=True),
            "next_after": serializers.IntegerField(help_text="Pass as after= for the next page."),
            "has_more": serializers.BooleanField(), "next": serializers.URLField(allow_null=True),
        })},
    )
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: Any = None) -> Response:
        run = self.get_object()
        after = _non_negative_int(request.query_params.get("after"), "after", 0)
        limit = min(_non_negative_int(request.query_params.get("limit"), "limit", 100) or 100, EVENTS_PAGE_MAX)
        # limit + 1 rows: the extra one says whether there are more
        rows = list(RunEvent.objects.filter(run_id=run.pk, seq__gt=after).order_by("seq")[: limit + 1])
        has_more = len(rows) > limit
        rows = rows[:limit]
        next_after = rows[-1].seq if rows else after
        next_url = None
        if has_more:
            next_url = request.build_absolute_uri(f"/api/v1/runs/{run.pk}/events?after={next_after}&limit={limit}")
        return Response({
            "run": str(run.pk), "status": run.status, "events": RunEventSerializer(rows, many=True).data,
            "next_after": next_after, "has_more": has_more, "next": next_url,
        })

    @extend_schema(
        parameters=[
            OpenApiParameter("after", int, description="Resume after this seq (default 0); the Last-Event-ID header wins."),
            OpenApiParameter("Last-Event-ID", int, OpenApiParameter.HEADER, required=False,
                             description="The last seq received (an EventSource sends it when it reconnects)."),
        ],
        responses={200: OpenApiResponse(str, description=(
            "Server-Sent Events: each committed trace event with its seq as the id, and message.delta frames (no id) "
            "with the model's text as it streams; ends after run.finished."))},
    )
    @action(detail=True, methods=["get"])
    def stream(self, request: Request, pk: Any = None) -> Any:
        """The run as Server-Sent Events (agents/sse.py): backlog after Last-Event-ID, then live, until it ends."""
        run = self.get_object()
        after = sse.parse_resume(request.headers.get("Last-Event-ID"), request.query_params.get("after"))
        if after < 0:
            raise exceptions.ValidationError(
                {"after": ["Last-Event-ID (or after=) must be a non-negative integer: the last seq you received."]}
            )
        return sse.stream_response(run.pk, after, slot=_stream_slot(self.actor, run.tenant_id))

    @extend_schema(request=None, responses={202: RunSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: Any = None) -> Response:
        run = self.get_object()
        run = services.cancel_run(actor=self.actor, run=run)
        return Response(RunSerializer(run, context={"request": request}).data, status=status.HTTP_202_ACCEPTED)


    @extend_schema(request=ResolveAttentionSerializer, responses={200: RunSerializer, 409: None})
    @action(detail=True, methods=["post"], url_path="resolve-attention")
    def resolve_attention(self, request: Request, pk: Any = None) -> Response:
        """Say what you checked of a run that needs attention: it no longer does (the reasons stay; audited)."""
        run = self.get_object()
        body = ResolveAttentionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            run = attention.resolve_attention(actor=self.actor, run=run, note=body.validated_data["note"], via="api")
        except DjangoPermissionDenied as exc:
            raise exceptions.PermissionDenied(str(exc)) from None
        return Response(RunSerializer(self.get_queryset().get(pk=run.pk), context={"request": request}).data)






def _stream_slot(actor: Any, tenant_id: int) -> open_streams.Slot:
    """A place among the caller's and the tenant's open streams, or a 429 saying which bound is full."""
    try:
        return open_streams.hold(open_streams.caller(actor), tenant_id)
    except open_streams.TooManyStreams as exc:
        raise exceptions.Throttled(wait=open_streams.RETRY_AFTER_SECONDS, detail=exc.message,
                                   code="too_many_streams") from None


def _non_negative_int(raw: str | None, name: str, default: int) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise exceptions.ValidationError({name: [f"Must be a non-negative integer; got {raw!r}."]})
    return value


class ByName(CursorPages):
    ordering = ("tenant_id", "slug")
    page_size = 100


class AgentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """``/agents``; ``/flows`` is the same with ``kind = flow`` (a flow is an agent whose versions hold a graph)."""

    kind = AgentKind.AGENT
    queryset = Agent.objects.select_related("current_version").order_by("tenant_id", "slug")
    serializer_class = AgentSerializer
    pagination_class = ByName
    lookup_field = "slug"

    def get_queryset(self) -> Any:
        return super().get_queryset().filter(kind=self.kind)

    def get_object(self) -> Agent:
        return visible_agent(self, self.kwargs["slug"])

    @extend_schema(request=AgentCreateSerializer, responses={201: AgentSerializer})
    def create(self, request: Request) -> Response:
        body = AgentCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        agent = services.create_agent(actor=self.actor, tenant=self.acting_tenant("operate"), kind=self.kind,
                                      **body.validated_data)
        return Response(AgentSerializer(agent, context={"request": request}).data, status=status.HTTP_201_CREATED)


def visible_agent(view: TenantScopedViewSet, slug: str) -> Agent:
    """The agent (or flow: the view's ``kind``) ``slug`` among the actor's tenants (``X-Tenant`` picks one)."""
    kind = getattr(view, "kind", AgentKind.AGENT)
    candidates = Agent.objects.select_related("current_version").for_actor(view.actor, "view").filter(slug=slug, kind=kind)
    tenant = view.request.headers.get("X-Tenant")
    if tenant:
        candidates = candidates.filter(tenant__slug=tenant)
    found = list(candidates[:2])
    if not found:
        raise exceptions.NotFound(f"No {'flow' if kind == AgentKind.FLOW else 'agent'} {slug!r} here.")
    if len(found) > 1:
        raise exceptions.ValidationError({"X-Tenant": ["Several of your tenants have this agent; name one with the X-Tenant header."]})
    view.check_object_permissions(view.request, found[0])
    return found[0]


class FlowViewSet(AgentViewSet):
    kind = AgentKind.FLOW


class AgentVersionViewSet(TenantScopedViewSet):
    """``/agents/<slug>/versions[/<number>]`` (and ``/flows/...``). A version a run used is read-only (409 on change)."""

    kind = AgentKind.AGENT
    scope_actions = {**TenantScopedViewSet.scope_actions, "preview_impact": "operate"}

    queryset = AgentVersion.objects.select_related("agent", "created_by")
    serializer_class = AgentVersionSerializer
    lookup_field = "number"

    def agent(self) -> Agent:
        return visible_agent(self, self.kwargs["slug"])

    def versions(self, agent: Agent) -> Any:
        used = Exists(Run.objects.filter(version_id=OuterRef("pk")))
        return self.get_queryset().filter(agent=agent).annotate(used=used).order_by("-number")

    def get_object(self) -> AgentVersion:
        agent = self.agent()
        version = self.versions(agent).filter(number=self.kwargs["number"]).first()
        if version is None:
            raise exceptions.NotFound(f"The {agent.kind} {agent.slug!r} has no version {self.kwargs['number']}.")
        return version

    def list(self, request: Request, slug: str) -> Response:
        return Response(AgentVersionSerializer(self.versions(self.agent()), many=True).data)

    def retrieve(self, request: Request, slug: str, number: int) -> Response:
        return Response(AgentVersionSerializer(self.get_object()).data)

    @extend_schema(request=AgentVersionWriteSerializer, responses={201: AgentVersionSerializer})
    def create(self, request: Request, slug: str) -> Response:
        agent = self.agent()
        body = AgentVersionWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        version = services.create_version(actor=self.actor, agent=agent, **body.validated_data)
        return Response(AgentVersionSerializer(self.versions(agent).get(pk=version.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=AgentVersionWriteSerializer, responses={200: AgentVersionSerializer, 409: None})
    def update(self, request: Request, slug: str, number: int, partial: bool = False) -> Response:
        version = self.get_object()
        self.check_object_permissions(request, version)
        body = AgentVersionWriteSerializer(data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        fields = {k: v for k, v in body.validated_data.items() if k != "make_current"}
        if fields or not body.validated_data.get("make_current"):
            version = services.update_version(actor=self.actor, version=version, **fields)
        if body.validated_data.get("make_current"):  # through the release gate, after any edit (an edit voids a replay)
            services.set_current_version(actor=self.actor, agent=version.agent, version=version, reason="make_current (API)")
        return Response(AgentVersionSerializer(self.versions(version.agent).get(pk=version.pk)).data)

    @extend_schema(request=AgentVersionWriteSerializer, responses={200: AgentVersionSerializer, 409: None})
    def partial_update(self, request: Request, slug: str, number: int) -> Response:
        return self.update(request, slug, number, partial=True)

    @extend_schema(request=VersionPreviewSerializer, responses={200: PreviewImpactResultSerializer})
    def preview_impact(self, request: Request, slug: str, number: int) -> Response:
        """What a proposed, unsaved tool list or policy for this version would have done to the tool calls its runs
        made in the last ``days`` (1 to 30). Validated like saving; saves nothing."""
        version = self.get_object()
        body = VersionPreviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        days = data.pop("days", None)
        checked = AgentVersionWriteSerializer(data=data, partial=True)  # the same checks as saving the version
        checked.is_valid(raise_exception=True)
        data = {k: v for k, v in checked.validated_data.items() if k in data}
        return Response(shadow.preview_version_change(version=version, actor=self.actor, fields=data, days=days))

    @extend_schema(responses={204: None, 409: None})
    def destroy(self, request: Request, slug: str, number: int) -> Response:
        version = self.get_object()
        self.check_object_permissions(request, version)
        services.delete_version(actor=self.actor, version=version)
        return Response(status=status.HTTP_204_NO_CONTENT)



class FlowVersionViewSet(AgentVersionViewSet):
    kind = AgentKind.FLOW
