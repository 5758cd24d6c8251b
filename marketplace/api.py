"""API v1 for the plugin catalog, per-tenant installs and release weights. Thin: the base viewset
scopes and authorises, one service call changes state."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from agents.models import Agent
from marketplace import services
from marketplace.models import Plugin, PluginInstall
from marketplace.serializers import (
    InstallConfigSerializer,
    InstallCreateSerializer,
    InstallSerializer,
    InstallUpgradeSerializer,
    PluginSerializer,
    ReleaseSerializer,
    ReleaseUpdateSerializer,
    RollbackSerializer,
)
from releases.models import EvaluationSet
from tenants.api import TenantScopedViewSet


class PluginViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The catalog: every plugin the running code provides (the same for every tenant)."""

    queryset = Plugin.objects.filter(available=True).order_by("key")
    serializer_class = PluginSerializer
    lookup_field = "key"

    def get_queryset(self) -> Any:
        if not (self.actor.is_superuser or self.actor.roles):
            raise exceptions.PermissionDenied("You belong to no tenant, so there is no catalog for you.")
        return self.queryset.all()


class PluginInstallViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = PluginInstall.objects.select_related("tenant", "plugin", "pending_plugin")
    serializer_class = InstallSerializer
    scope_actions = {
        **TenantScopedViewSet.scope_actions, "upgrade": "operate", "disable": "operate", "enable": "operate",
        "accept_consent": "own",
    }

    @extend_schema(request=InstallCreateSerializer, responses={201: InstallSerializer})
    def create(self, request: Request) -> Response:
        body = InstallCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        tenant = self.acting_tenant("operate")
        install = services.install_plugin(tenant=tenant, plugin_key=body.validated_data["plugin"], actor=self.actor,
                        config=body.validated_data.get("config"))
        return Response(InstallSerializer(install).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=InstallConfigSerializer, responses={200: InstallSerializer})
    def partial_update(self, request: Request, pk: Any = None) -> Response:
        install = self.get_object()
        body = InstallConfigSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        install = services.configure_plugin(install=install, config=body.validated_data["config"], actor=self.actor)
        return Response(InstallSerializer(install).data)

    def destroy(self, request: Request, pk: Any = None) -> Response:
        services.uninstall_plugin(install=self.get_object(), actor=self.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=InstallUpgradeSerializer, responses={200: InstallSerializer})
    @action(detail=True, methods=["post"])
    def upgrade(self, request: Request, pk: Any = None) -> Response:
        install = self.get_object()
        body = InstallUpgradeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        install = services.upgrade_plugin(install=install, actor=self.actor, config=body.validated_data.get("config"))
        return Response(InstallSerializer(install).data)

    @extend_schema(request=None, responses={200: InstallSerializer})
    @action(detail=True, methods=["post"])
    def disable(self, request: Request, pk: Any = None) -> Response:
        install = services.disable_plugin(install=self.get_object(), actor=self.actor)
        return Response(InstallSerializer(install).data)

    @extend_schema(request=None, responses={200: InstallSerializer})
    @action(detail=True, methods=["post"])
    def enable(self, request: Request, pk: Any = None) -> Response:
        install = services.enable_plugin(install=self.get_object(), actor=self.actor)
        return Response(InstallSerializer(install).data)

    @extend_schema(request=None, responses={200: InstallSerializer})
    @action(detail=True, methods=["post"], url_path="accept-consent")
    def accept_consent(self, request: Request, pk: Any = None) -> Response:
        install = services.accept_consent(install=self.get_object(), actor=self.actor)
        return Response(InstallSerializer(install).data)


class ReleaseViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """An agent's release weights over its versions, by the agent's slug."""

    queryset = Agent.objects.select_related("current_version").order_by("tenant_id", "slug")
    serializer_class = ReleaseSerializer
    lookup_field = "slug"
    scope_actions = {**TenantScopedViewSet.scope_actions, "rollback": "operate"}

    def get_object(self) -> Agent:
        candidates = self.get_queryset().filter(slug=self.kwargs["slug"])
        tenant = self.request.headers.get("X-Tenant")
        if tenant:
            candidates = candidates.filter(tenant__slug=tenant)
        found = list(candidates[:2])
        if not found:
            raise exceptions.NotFound(f"No agent {self.kwargs['slug']!r} here.")
        if len(found) > 1:
            raise exceptions.ValidationError({"X-Tenant": ["Several of your tenants have this agent; name one with the X-Tenant header."]})
        self.check_object_permissions(self.request, found[0])
        return found[0]

    @extend_schema(request=ReleaseUpdateSerializer, responses={200: ReleaseSerializer})
    def update(self, request: Request, slug: Any = None) -> Response:
        agent = self.get_object()
        body = ReleaseUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if "gate" in body.validated_data:
            self._set_gate(agent, body.validated_data["gate"])
        if "weights" in body.validated_data:
            services.set_release_weights(agent=agent, weights=body.validated_data["weights"], actor=self.actor)
        agent.refresh_from_db()
        return Response(ReleaseSerializer(agent).data)

    def _set_gate(self, agent: Agent, gate: dict[str, Any] | None) -> None:
        if gate is None:
            services.set_release_gate(agent=agent, evaluation_set=None, actor=self.actor)
            return
        evaluation_set = EvaluationSet.objects.filter(pk=gate["evaluation_set"], tenant_id=agent.tenant_id, agent=agent).first()
        if evaluation_set is None:  # another tenant's set, another agent's, or none: the same answer
            raise serializers.ValidationError({"gate": {"evaluation_set": [
                f"No evaluation set {gate['evaluation_set']} of {agent.slug!r}'s runs here."]}})
        services.set_release_gate(agent=agent, evaluation_set=evaluation_set, min_pass_rate=gate["min_pass_rate"],
                                  model_mode=gate["model_mode"], enabled=gate["enabled"], checks=gate.get("checks"),
                                  actor=self.actor)

    @extend_schema(request=RollbackSerializer, responses={200: ReleaseSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request: Request, slug: Any = None) -> Response:
        agent = self.get_object()
        body = RollbackSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        version = agent.versions.filter(number=body.validated_data["version"]).first()
        if version is None:
            raise serializers.ValidationError({"version": [f"Agent {agent.slug!r} has no v{body.validated_data['version']}."]})
        services.rollback_version(agent=agent, version=version, actor=self.actor,
              reason=body.validated_data.get("reason") or "manual (API)")
        agent.refresh_from_db()
        return Response(ReleaseSerializer(agent).data)
