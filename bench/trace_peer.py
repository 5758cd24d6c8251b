"""The raw Channels floor for ``trace_fanout.py``: a bare consumer joined to a group, nothing else.

No authentication, no tenancy, no backfill, no heartbeat: ``/ws/peer/<name>/`` joins the group
``bench.peer.<name>`` and relays each ``run.events`` message's frames as JSON text. It runs under
the same uvicorn (``--ws websockets-sansio``) and the same channel layer settings (``config.settings``:
channels_redis, same capacity and expiry) as the application, so the difference is our code.

    python -m uvicorn --app-dir bench trace_peer:application --port 9001 --ws websockets-sansio --lifespan off
"""

from __future__ import annotations

import json
import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402


class PeerConsumer(AsyncWebsocketConsumer):
    group = ""

    async def connect(self) -> None:
        self.group = "bench.peer." + self.scope["url_route"]["kwargs"]["name"]
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def run_events(self, message: dict[str, Any]) -> None:
        for frame in message["events"]:
            await self.send(text_data=json.dumps(frame))


application = ProtocolTypeRouter({"websocket": URLRouter([path("ws/peer/<slug:name>/", PeerConsumer.as_asgi())])})
