"""``/api/v1/notification-channels``: where a tenant's approval requests are announced. Thin: parse, authorise,
call ``approvals.channels`` (the admin's service too)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from approvals import channels
from approvals.models import ChannelKind, NotificationChannel
from core.api import CursorPages
from tenants.api import TenantScopedViewSet


class ToolNames(serializers.ListField):
    """Written as a list of the tenant's tool names; read from the channel's tools."""

    def to_representation(self, data: Any) -> list[str]:
        return sorted(t.name for t in data.all())


class MaskedTarget(serializers.CharField):
    """Written as the full URL; read masked (a webhook URL is a credential), the same for every role."""

    def to_representation(self, value: Any) -> str:
        return channels.shown_target(str(value or ""))


class ChannelSerializer(serializers.ModelSerializer):
    kind = serializers.ChoiceField(choices=ChannelKind.choices, help_text="email, webhook_slack or webhook_json")
    events = serializers.ListField(child=serializers.CharField(max_length=16), help_text="arrived, expiring")
    target = MaskedTarget(max_length=500, required=False, allow_blank=True, default="",
                          help_text="The webhook URL. Read back masked (scheme, host, last 4 characters); writing the "
                                    "masked value back keeps the stored URL.")
    tools = ToolNames(child=serializers.CharField(max_length=64), required=False,
                                  help_text="Names of the tenant's tools; empty: every tool.")
    secret = serializers.CharField(write_only=True, required=False, allow_blank=True, max_length=80,
                                   help_text="secret:NAME of a signing secret granted to the tenant; never returned.")
    secret_status = serializers.SerializerMethodField()
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = NotificationChannel
        fields = ["id", "tenant", "name", "kind", "target", "events", "tools", "enabled", "secret", "secret_status", "created_at"]
        read_only_fields = ["id", "tenant", "secret_status", "created_at"]

    def get_secret_status(self, channel: NotificationChannel) -> str:
        return channels.secret_status(channel)


class ChannelsByName(CursorPages):
    ordering = ("tenant_id", "name")
    page_size = 100


class NotificationChannelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    queryset = NotificationChannel.objects.select_related("tenant").prefetch_related("tools").order_by("tenant_id", "name")
    serializer_class = ChannelSerializer
    pagination_class = ChannelsByName

    @staticmethod
    def _parts(data: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
        secret = data.pop("secret", channels.KEEP)
        tools = data.pop("tools", channels.KEEP)
        return data, secret, tools

    @extend_schema(request=ChannelSerializer, responses={201: ChannelSerializer})
    def create(self, request: Request) -> Response:
        tenant = self.acting_tenant("operate")
        body = ChannelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        values, secret, tools = self._parts(dict(body.validated_data))
        channel = channels.create_channel(actor=self.actor, tenant=tenant, values=values, secret=secret, tools=tools)
        return Response(ChannelSerializer(channel).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ChannelSerializer, responses={200: ChannelSerializer})
    def update(self, request: Request, pk: Any = None, partial: bool = False) -> Response:
        channel = self.get_object()
        body = ChannelSerializer(channel, data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        values, secret, tools = self._parts(dict(body.validated_data))
        channel = channels.update_channel(actor=self.actor, channel=channel, values=values, secret=secret, tools=tools)
        return Response(ChannelSerializer(channel).data)

    def partial_update(self, request: Request, pk: Any = None) -> Response:
        return self.update(request, pk, partial=True)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, pk: Any = None) -> Response:
        channels.delete_channel(actor=self.actor, channel=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
