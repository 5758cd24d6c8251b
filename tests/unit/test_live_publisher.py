"""The live publisher: the committing thread hands batches over and goes on; they are sent in order."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from core import live


def test_batches_are_sent_in_submission_order_by_one_thread_and_a_failed_one_is_dropped() -> None:
    publisher = live._publisher  # the process's one publisher (its loop lives as long as the process)
    sent: list[int] = []
    threads: set[str] = set()

    def batch(n: int):  # type: ignore[no-untyped-def]
        async def send() -> None:
            threads.add(threading.current_thread().name)
            if n == 3:
                raise ConnectionError("channel layer down")
            await asyncio.sleep(0)
            sent.append(n)

        return send

    for n in range(50):
        publisher.submit(batch(n))  # returns at once: nothing has been sent by this thread
    assert live.flush()
    assert sent == [n for n in range(50) if n != 3]
    assert threads == {"agentops-publisher"}


def test_plain_and_async_batches_share_one_order_and_a_slow_async_one_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain callable (the registry asked) and a coroutine (the layer's group_send) keep their order; a
    coroutine past the timeout is dropped and the next batch still goes."""
    monkeypatch.setattr(live, "PUBLISH_TIMEOUT_SECONDS", 0.2)
    sent: list[str] = []

    async def slow() -> None:
        await asyncio.sleep(5)
        sent.append("slow")

    async def quick() -> None:
        sent.append("async")

    live._publisher.submit(lambda: sent.append("plain 1"))
    live._publisher.submit(quick)
    live._publisher.submit(slow)
    live._publisher.submit(lambda: sent.append("plain 2"))
    assert live.flush()
    assert sent == ["plain 1", "async", "plain 2"]


def test_a_full_queue_drops_the_batch_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    publisher = live._Publisher()
    monkeypatch.setattr(publisher, "MAX_QUEUED", 2)
    dropped: list[int] = []
    publisher.submit(release.wait)  # the thread is busy with this one; two more wait in the queue
    time.sleep(0.1)
    publisher.submit(lambda: None, on_drop=lambda: dropped.append(1))
    publisher.submit(lambda: None, on_drop=lambda: dropped.append(2))
    publisher.submit(lambda: None, on_drop=lambda: dropped.append(3))
    assert dropped == [3]
    release.set()
    deadline = time.monotonic() + 5
    while publisher._queue is not None and publisher._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert publisher.flush(1)  # room again: the queued batches went


def test_without_a_registry_every_group_is_sent_to_through_the_layers_group_send(
    monkeypatch: pytest.MonkeyPatch, settings: object,
) -> None:
    """Embedded mode (``LIVE_WATCHED`` None, the in-memory layer): no registry to ask, so every step is framed and sent
    with the layer's public ``group_send``, joins touch only the layer, and watchers never resync."""
    from core.channel_layers import EmbeddedChannelLayer

    settings.LIVE_WATCHED = None  # type: ignore[attr-defined]
    layer = EmbeddedChannelLayer()
    monkeypatch.setattr(live, "get_channel_layer", lambda: layer)
    assert live.redis_layer.registry() is None
    assert not live.unwatched("0" * 32, 1) and live.resync_after() is None

    async def scenario() -> list[dict[str, object]]:
        watcher = await layer.new_channel()
        await live.join_group(layer, live.run_group("0" * 32), watcher)
        await live.join_group(layer, live.tenant_runs_group(1), watcher)
        await live.refresh_membership(layer, live.tenant_runs_group(1), watcher)
        live.publish_run_events(run_id="0" * 32, tenant_id=1, frames=[{"seq": 1}], summary={"id": "r"})
        await asyncio.to_thread(live.flush)
        got = [await asyncio.wait_for(layer.receive(watcher), 2) for _ in range(2)]
        await live.leave_group(layer, live.run_group("0" * 32), watcher)
        await live.leave_group(layer, live.tenant_runs_group(1), watcher)
        return got

    got = asyncio.run(scenario())
    assert [m["type"] for m in got] == ["run.events", "run.summary"]
    assert got[0]["texts"] == [live.encode_frame({"seq": 1})]
