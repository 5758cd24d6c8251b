"""``/ws/console/runs/``: the run list's live feed, for a logged-in user (session cookie).

``connect()`` authenticates (a user's session, checked for Origin by tenants/ws_auth.py) and
joins the ``tenant.<id>.runs`` group of each tenant the user may view — and no other, so a
foreign tenant's summaries never reach this socket. Each summary is then re-read through the
tenancy gate into the row the run list shows (agent, user, tokens, cost, duration): a second
check, and the row carries what a bare summary lacks. That is one primary-key query per
summary per watcher, bounded by steps, not by events.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from channels.db import database_sync_to_async
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.utils import timezone

from agents.models import ACTIVE_STATUSES, Run
from console import queries
from core import live
from tenants.feeds import TenantFeedConsumer
from tenants.scoping import ANONYMOUS, Actor

#: The most runs a socket's one resync sends (core/live.py ``resync_after``): the newest first.
RESYNC_ROWS = 200


@database_sync_to_async
def _clock_and_active(tenant_ids: list[int]) -> tuple[Any, list[Any]]:
    """Now, and the runs of these tenants that are active now (the index on status): every run whose row may change
    from here on is one of these or is created later."""
    now = timezone.now()
    active = Run.objects.filter(tenant_id__in=tenant_ids, status__in=ACTIVE_STATUSES).order_by("-created_at")
    return now, list(active.values_list("pk", flat=True)[:RESYNC_ROWS])


@database_sync_to_async
def _rows_since(actor: Actor, before: tuple[Any, list[Any]]) -> list[dict[str, Any]]:
    started, active = before
    since = started - dt.timedelta(seconds=5)  # a run created while this socket was being set up
    runs = queries.runs_for(actor).filter(Q(pk__in=active) | Q(created_at__gte=since)).order_by("-created_at")
    now = timezone.now()
    return [queries.run_row(run, now=now) for run in runs[:RESYNC_ROWS]]


@database_sync_to_async
def _row(actor: Actor, run_id: Any) -> dict[str, Any] | None:
    try:
        run = queries.runs_for(actor).filter(pk=run_id).first()
    except (ValidationError, ValueError):
        return None
    return queries.run_row(run) if run is not None else None


class RunListConsumer(TenantFeedConsumer):
    def admits(self, actor: Actor) -> bool:
        # The console is for people with a session; API clients use /ws/runs/<id>/.
        return actor is not ANONYMOUS and actor.user is not None and actor.api_key is None

    def group_for(self, tenant_id: int) -> str:
        return live.tenant_runs_group(tenant_id)

    resyncs = True  # the publisher may not have known this socket for a moment after it joined (core/live.py)

    async def before_joining(self, tenant_ids: list[int]) -> Any:
        return await _clock_and_active(tenant_ids)

    async def resync(self, before: Any) -> None:
        """The rows of the runs that were active when this socket joined or were created since, as they are now."""
        for row in await _rows_since(self.actor, before):
            await self.send_json({"type": "run.summary", "run": row})

    async def run_summary(self, message: dict[str, Any]) -> None:
        summary = message.get("run") or {}
        row = await _row(self.actor, summary.get("id"))
        if row is None:
            return
        await self.send_json({"type": "run.summary", "run": row})
