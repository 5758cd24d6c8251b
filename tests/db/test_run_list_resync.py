"""The console run list's socket reads the database once after joining (console/consumers.py ``resync``).

The publisher may use whether anyone watches the tenant's run list as read up to ``LIVE_MEMBERS_TTL_SECONDS`` ago
(core/redis_layer.py), so a
summary committed right after a page's socket joined may not have been sent to it. That long after joining, the
socket sends the rows of the runs that were active when it joined or were created since, as they are now; of its
own tenants only.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async
from django.utils import timezone

from agents.models import Run, RunStatus, Session
from console.consumers import RunListConsumer
from core import live
from tenants.scoping import actor_for_user
from tests.factories import World, make_world

pytestmark = pytest.mark.django_db(transaction=True)


def _run(world: World, status: str) -> Run:
    session = Session.objects.create(tenant=world.tenant, agent=world.agent)
    return Run.objects.create(tenant=world.tenant, agent=world.agent, version=world.version, session=session,
                              input="list me", status=status)


def _finish(run_id: Any) -> None:
    from django.db import connection

    try:
        Run.objects.filter(pk=run_id).update(status=RunStatus.FINISHED, terminal_reason="final_answer")
    finally:
        connection.close()


class ListSocket(ApplicationCommunicator):
    def __init__(self, actor: Any) -> None:
        scope = {"type": "websocket", "path": "/ws/console/runs/", "query_string": b"", "headers": [], "subprotocols": [],
                 "actor": actor, "url_route": {"args": (), "kwargs": {}}}
        super().__init__(RunListConsumer.as_asgi(), scope)

    async def frames(self, wait: float) -> list[dict[str, Any]]:
        """What the socket sent within ``wait`` seconds (asgiref's ``receive_output`` cancels the app on a timeout)."""
        await asyncio.sleep(wait)
        out: list[dict[str, Any]] = []
        while not await self.receive_nothing(0.05):
            frame = json.loads((await self.receive_output(1))["text"])
            if frame.get("type") != "heartbeat":
                out.append(frame)
        return out


@pytest.mark.parametrize("resync", [0.5, None], ids=["resync", "no-resync"])
def test_the_list_socket_reads_the_runs_that_changed_since_it_joined_of_its_tenants_only(
    monkeypatch: pytest.MonkeyPatch, resync: float | None
) -> None:
    monkeypatch.setattr(live, "resync_after", lambda: resync)
    world, other = make_world("lista"), make_world("listb")
    old = _run(world, RunStatus.FINISHED)  # finished a minute before the page: not sent again
    Run.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(minutes=1))
    active = _run(world, RunStatus.RUNNING)
    foreign_active = _run(other, RunStatus.RUNNING)
    actor = actor_for_user(world.operator)

    async def scenario() -> list[dict[str, Any]]:
        ws = ListSocket(actor)
        await ws.send_input({"type": "websocket.connect"})
        assert (await ws.receive_output(5))["type"] == "websocket.accept"
        # committed after the socket joined, published to nobody (the publisher's members were read before)
        await asyncio.to_thread(_finish, active.pk)
        await asyncio.to_thread(_finish, foreign_active.pk)
        created = await database_sync_to_async(_run)(world, RunStatus.QUEUED)
        await database_sync_to_async(_run)(other, RunStatus.QUEUED)
        frames = await ws.frames(1.5)
        await ws.send_input({"type": "websocket.disconnect", "code": 1000})
        await ws.wait(5)
        return [f["run"] | {"created": str(created.pk)} for f in frames]

    rows = asyncio.run(scenario())
    if resync is None:
        assert rows == []  # nothing read by itself: the resync is what sends them
        return
    by_id = {row["id"]: row for row in rows}
    assert set(by_id) == {str(active.pk), rows[0]["created"]}, rows  # not the old run, nothing of the other tenant
    assert by_id[str(active.pk)]["status"] == "finished" and by_id[rows[0]["created"]]["status"] == "queued"
    assert all(row["tenant"] == world.tenant.slug for row in rows)
    assert str(old.pk) not in by_id and str(foreign_active.pk) not in by_id


def test_the_list_socket_renews_its_memberships_and_closes_when_it_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    """tenants/feeds.py: a tenant feed renews each of its groups every third of the layer's group_expiry (a member
    not renewed is dropped, by the layer and by the watched-groups registry: core/live.py); a renewal that fails
    closes the socket (1011) so the page reconnects, instead of leaving it open and silent."""
    monkeypatch.setattr(live, "resync_after", lambda: None)
    monkeypatch.setattr(live, "refresh_every", lambda layer: 0.2)
    renewed: list[tuple[str, str]] = []
    failing = False

    async def refresh(layer: Any, group: str, channel: str) -> None:
        if failing:
            raise ConnectionError("the channel layer went away")
        renewed.append((group, channel))

    monkeypatch.setattr(live, "refresh_membership", refresh)
    world, other = make_world("renewa"), make_world("renewb")
    actor = actor_for_user(world.operator)

    async def scenario() -> dict[str, Any]:
        nonlocal failing
        ws = ListSocket(actor)
        await ws.send_input({"type": "websocket.connect"})
        assert (await ws.receive_output(5))["type"] == "websocket.accept"
        await asyncio.sleep(0.7)
        failing = True
        return await ws.receive_output(3)  # no frame is sent in between: the close

    closed = asyncio.run(scenario())
    assert closed["type"] == "websocket.close" and closed.get("code") == 1011, closed
    groups = {group for group, _ in renewed}
    assert groups == {live.tenant_runs_group(world.tenant.pk)}, renewed  # its tenant's group only, never another's
    assert len(renewed) >= 2 and len({channel for _, channel in renewed}) == 1
    assert live.tenant_runs_group(other.tenant.pk) not in groups
