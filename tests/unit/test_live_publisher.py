"""The live publisher: the committing thread hands batches over and goes on; they are sent in order."""

from __future__ import annotations

import asyncio
import threading

from config import live


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
