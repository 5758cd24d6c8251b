"""``/ws/console/runs/``: the run list's live feed, for a logged-in user (session cookie).

``connect()`` authenticates (a user's session, checked for Origin by tenants/ws_auth.py) and
joins the ``tenant.<id>.runs`` group of each tenant the user may view — and no other, so a
foreign tenant's summaries never reach this socket. Each summary is then re-read through the
tenancy gate into the row the run list shows (agent, user, tokens, cost, duration): a second
check, and the row carries what a bare summary lacks. That is one primary-key query per
summary per watcher, bounded by steps, not by events.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.core.exceptions import ValidationError

from agents import live
from console import queries
from tenants.models import Tenant
from tenants.scoping import ANONYMOUS, Actor


@database_sync_to_async
def _tenant_ids(actor: Actor) -> list[int]:
    ids = actor.tenant_ids("view")
    if ids is None:  # a superuser: every active tenant at connect time
        return list(Tenant.objects.filter(is_active=True).values_list("pk", flat=True))
    return ids


@database_sync_to_async
def _row(actor: Actor, run_id: Any) -> dict[str, Any] | None:
    try:
        run = queries.runs_for(actor).filter(pk=run_id).first()
    except (ValidationError, ValueError):
        return None
    return queries.run_row(run) if run is not None else None


class RunListConsumer(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]

    async def connect(self) -> None:
        self.groups_joined = []
        actor: Actor = self.scope.get("actor", ANONYMOUS)
        if actor is ANONYMOUS or actor.user is None or actor.api_key is not None:
            await self.close()  # the console is for people with a session; API clients use /ws/runs/<id>/
            return
        self.actor = actor
        for tenant_id in await _tenant_ids(actor):
            group = live.tenant_runs_group(tenant_id)
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Nothing to receive: the feed is one-way."""

    async def run_summary(self, message: dict[str, Any]) -> None:
        summary = message.get("run") or {}
        row = await _row(self.actor, summary.get("id"))
        if row is None:
            return
        await self.send_json({"type": "run.summary", "run": row})
