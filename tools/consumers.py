"""``/ws/approvals/``: the approver inbox's live feed (requests arriving or decided elsewhere)."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from agents import live
from tenants.models import Tenant
from tenants.scoping import ANONYMOUS, Actor


@database_sync_to_async
def _tenant_ids(actor: Actor) -> list[int]:
    return list(Tenant.objects.for_actor(actor, "review").values_list("pk", flat=True))


class ApprovalsConsumer(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]

    async def connect(self) -> None:
        actor: Actor = self.scope.get("actor", ANONYMOUS)
        self.groups_joined = []
        if actor is ANONYMOUS:
            await self.close()
            return
        for tenant_id in await _tenant_ids(actor):
            group = live.tenant_approvals_group(tenant_id)
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def approval_changed(self, message: dict[str, Any]) -> None:
        await self.send_json({"type": "approval", **message["approval"]})
