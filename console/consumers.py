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
from django.core.exceptions import ValidationError

from config import live
from console import queries
from tenants.feeds import TenantFeedConsumer
from tenants.scoping import ANONYMOUS, Actor


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

    async def run_summary(self, message: dict[str, Any]) -> None:
        summary = message.get("run") or {}
        row = await _row(self.actor, summary.get("id"))
        if row is None:
            return
        await self.send_json({"type": "run.summary", "run": row})
