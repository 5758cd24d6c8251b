"""API v1 for model providers: ``/api/v1/providers`` (CRUD) and ``POST /api/v1/providers/<id>/test``.

The API key and default headers are write-only: the responses say ``api_key_status`` ("set
(encrypted)", "set (from secret:NAME)", "not set") and list header names with masked values.
A tenant's provider may not reference environment variables (``env:NAME`` is a 400 naming the field).
A tenant's providers are scoped like everything else (a foreign one is a 404); shared providers
(no tenant) are seen and managed by superusers only (``"shared": true`` on create).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import exceptions, mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from agents import provider_services as services
from agents.models import Provider, ProviderKind
from agents.providers import ModelEntry, key_status, masked_headers
from tenants.api import TenantScopedViewSet


@extend_schema_field({"type": "object", "additionalProperties": ModelEntry.model_json_schema()})
class ModelsField(serializers.JSONField):
    """The ``models`` table; its OpenAPI schema is the typed document's (``agents.providers.ModelEntry``)."""


class ProviderSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    shared = serializers.BooleanField(write_only=True, required=False, default=False,
                                      help_text="Superusers only: a provider for every tenant.")
    models = ModelsField(source="offered_models", required=False, help_text=Provider._meta.get_field("offered_models").help_text)
    kind = serializers.ChoiceField(choices=ProviderKind.choices, required=False)
    api_key = serializers.CharField(
        write_only=True, required=False, allow_blank=True, trim_whitespace=True, style={"input_type": "password"},
        help_text="Write-only. The key (stored encrypted); empty clears it. Shared providers (and tenants granted the "
                  "secret) may write secret:NAME to read PROVIDER_SECRET_NAME; env:NAME is refused.",
    )
    api_key_status = serializers.SerializerMethodField()
    default_headers = serializers.DictField(child=serializers.CharField(allow_blank=True), write_only=True, required=False,
                                            help_text="Write-only; replaces all headers ({} clears). A value may be secret:NAME.")
    default_headers_masked = serializers.SerializerMethodField()

    class Meta:
        model = Provider
        fields = [
            "id", "name", "tenant", "shared", "kind", "base_url", "api_key", "api_key_status", "default_headers",
            "default_headers_masked", "timeout", "max_retries", "models", "requests_per_minute", "tokens_per_minute",
            "enabled", "created_at", "updated_at",
        ]
        read_only_fields = ["id", "tenant", "created_at", "updated_at"]
        # Uniqueness and field rules are checked by the service, with one wording for API and admin.
        validators: list[Any] = []
        extra_kwargs = {"name": {"validators": []}, "base_url": {"required": False}}

    def get_api_key_status(self, provider: Provider) -> str:
        return key_status(provider)

    def get_default_headers_masked(self, provider: Provider) -> dict[str, str]:
        return masked_headers(provider)


class ProviderViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = Provider.objects.select_related("tenant").order_by("tenant_id", "name")
    serializer_class = ProviderSerializer
    scope_actions = {**TenantScopedViewSet.scope_actions, "test": "operate"}

    def check_object_permissions(self, request: Any, obj: Any) -> None:
        super().check_object_permissions(request, obj)
        if self.tenant_action() != "view" and not services.may_manage(self.actor, obj.tenant_id):
            raise exceptions.PermissionDenied("Only superusers may change or test a shared provider.")

    def _parts(self, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        secrets = {name: data.pop(name) for name in ("api_key", "default_headers") if name in data}
        data.pop("shared", None)
        return data, secrets

    def create(self, request: Request) -> Response:
        body = ProviderSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        shared = body.validated_data.get("shared", False)
        if shared and not self.actor.is_superuser:
            raise exceptions.PermissionDenied("Only superusers may create a shared provider.")
        tenant = None if shared else self.acting_tenant("operate")
        values, secrets = self._parts(dict(body.validated_data))
        provider = services.create_provider(actor=self.actor, tenant=tenant, values=values, **secrets)
        return Response(ProviderSerializer(provider).data, status=status.HTTP_201_CREATED)

    def update(self, request: Request, pk: Any = None, partial: bool = False) -> Response:
        provider = self.get_object()
        body = ProviderSerializer(provider, data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        values, secrets = self._parts(dict(body.validated_data))
        provider = services.update_provider(actor=self.actor, provider=provider, values=values, **secrets)
        return Response(ProviderSerializer(provider).data)

    def partial_update(self, request: Request, pk: Any = None) -> Response:
        return self.update(request, pk, partial=True)

    def destroy(self, request: Request, pk: Any = None) -> Response:
        provider = self.get_object()
        services.delete_provider(actor=self.actor, provider=provider)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=None,
        responses={200: inline_serializer("ConnectionCheck", {
            "ok": serializers.BooleanField(), "message": serializers.CharField(), "latency_ms": serializers.IntegerField(),
            "models": serializers.ListField(child=serializers.CharField()),
            "missing_models": serializers.ListField(child=serializers.CharField()),
        })},
    )
    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: Any = None) -> Response:
        provider = self.get_object()
        check = services.check_connection(actor=self.actor, provider=provider)
        return Response({
            "ok": check.ok, "message": check.message, "latency_ms": check.latency_ms,
            "models": check.models, "missing_models": check.missing_models,
        })
