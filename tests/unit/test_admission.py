"""Issue #14: past MAX_CONCURRENT_REQUESTS in progress, a server process answers 503 + Retry-After at once, before Django."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from core import outages
from core.admission import AdmissionLimit


class Held:
    """An app whose requests stay in progress until released, counting what reached it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.reached = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.reached += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def _request(app: Any, path: str = "/api/v1/runs", kind: str = "http") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": kind, "path": path, "headers": []}, receive, send)
    return sent


def test_requests_beyond_the_limit_are_refused_at_once_and_the_limit_frees_as_requests_end() -> None:
    async def scenario() -> None:
        inner = Held()
        app = AdmissionLimit(inner, limit=2)
        # given two requests in progress
        first = [asyncio.create_task(_request(app)) for _ in range(2)]
        await asyncio.sleep(0)
        assert inner.reached == 2
        # when a third arrives, it is answered 503 at once, in the API's error body, without reaching Django
        refused = await asyncio.wait_for(_request(app), timeout=5)
        assert refused[0]["status"] == 503 and inner.reached == 2
        headers = dict(refused[0]["headers"])
        assert int(headers[b"retry-after"]) == outages.BUSY_RETRY_AFTER_SECONDS
        body = json.loads(refused[1]["body"])
        assert body["error"]["code"] == "dependency_unavailable" and body["error"]["dependency"] == "server"
        assert body["error"]["field"] is None and "capacity" in body["error"]["message"]
        # probes and websockets are never refused
        probe = asyncio.create_task(_request(app, "/healthz"))
        await asyncio.sleep(0)
        assert inner.reached == 3
        # and once the requests in progress end, the next one is served
        inner.release.set()
        assert [(await t)[0]["status"] for t in [*first, probe]] == [200, 200, 200]
        assert (await _request(app))[0]["status"] == 200 and app.in_progress == 0

    asyncio.run(scenario())


def test_zero_means_no_limit() -> None:
    async def scenario() -> None:
        inner = Held()
        app = AdmissionLimit(inner, limit=0)
        tasks = [asyncio.create_task(_request(app)) for _ in range(50)]
        await asyncio.sleep(0)
        assert inner.reached == 50
        inner.release.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
