"""The embedded channel layer: the in-memory layer, made safe to call from worker threads.

In embedded mode the Celery worker runs in threads of the server process. Channels'
``InMemoryChannelLayer`` keeps asyncio queues that belong to the server's event loop, so a
``group_send`` from a worker thread (on its own loop) is handed over to the server loop
instead of touching those queues from the wrong thread.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.layers import InMemoryChannelLayer


class EmbeddedChannelLayer(InMemoryChannelLayer):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._home: asyncio.AbstractEventLoop | None = None

    def _remember_loop(self) -> None:
        if self._home is None or self._home.is_closed():
            self._home = asyncio.get_running_loop()

    async def _on_home(self, coro: Any) -> Any:
        current = asyncio.get_running_loop()
        home = self._home
        if home is None or home is current or home.is_closed() or not home.is_running():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, home))

    async def receive(self, channel: str) -> Any:
        self._remember_loop()
        return await super().receive(channel)

    async def group_add(self, group: str, channel: str) -> None:
        self._remember_loop()
        await super().group_add(group, channel)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        await self._on_home(super().send(channel, message))

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await self._on_home(super().group_send(group, message))

    async def group_discard(self, group: str, channel: str) -> None:
        await self._on_home(super().group_discard(group, channel))
