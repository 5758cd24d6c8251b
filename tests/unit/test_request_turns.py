"""Issue #14: a server process runs at most REQUEST_THREADS requests' Django at once, the others waiting their turn in
order; a request running past its turn stops counting, so a slow one cannot hold the process up (config/handler.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from config.handler import Turns


class Gauge:
    """Counts the calls running on threads at once, and the order they started in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.started: list[int] = []

    def work(self, n: int, seconds: float = 0.02, until: threading.Event | None = None) -> int:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.started.append(n)
        try:
            if until is not None:
                until.wait(5)
            else:
                time.sleep(seconds)
            return n
        finally:
            with self.lock:
                self.now -= 1


async def _on_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def test_at_most_size_calls_run_at_once_and_the_others_start_in_the_order_they_came() -> None:
    gauge, turns, order = Gauge(), Turns(2, turn=5.0), []

    async def job(n: int) -> int:
        order.append(n)  # in the event loop, as the call's turn comes
        return await _on_thread(gauge.work, n)

    async def main() -> list[int]:
        return await asyncio.gather(*(turns.run(job(n)) for n in range(10)))

    assert asyncio.run(main()) == list(range(10))
    assert gauge.most == 2
    assert order == list(range(10))


def test_without_a_bound_every_call_runs_at_once() -> None:
    gauge, turns = Gauge(), Turns(0, turn=5.0)

    async def main() -> list[int]:
        return await asyncio.gather(*(turns.run(_on_thread(gauge.work, n, 0.2)) for n in range(5)))

    assert asyncio.run(main()) == list(range(5))
    assert gauge.most == 5


def test_a_call_running_past_its_turn_lets_the_next_one_start_and_still_returns_its_answer() -> None:
    gauge, turns, slow_done = Gauge(), Turns(1, turn=0.05), threading.Event()

    async def main() -> tuple[int, int, bool]:
        slow = asyncio.ensure_future(turns.run(_on_thread(gauge.work, 1, 0, slow_done)))
        await asyncio.sleep(0.01)
        quick = await asyncio.wait_for(turns.run(_on_thread(gauge.work, 2, 0.01)), 2)  # starts while the slow one runs
        still_running = not slow.done()
        slow_done.set()
        return await slow, quick, still_running

    assert asyncio.run(main()) == (1, 2, True)
    assert gauge.most == 2  # they overlapped: the slow one had stopped counting


def test_a_call_that_fails_gives_its_turn_back() -> None:
    turns = Turns(1, turn=5.0)

    def boom() -> None:
        raise ValueError("the view failed")

    async def main() -> int:
        with pytest.raises(ValueError, match="the view failed"):
            await turns.run(_on_thread(boom))
        return await asyncio.wait_for(turns.run(_on_thread(lambda: 7)), 2)

    assert asyncio.run(main()) == 7


def test_a_request_cancelled_while_it_waits_never_runs_and_holds_no_turn() -> None:
    gauge, turns, release = Gauge(), Turns(1, turn=5.0), threading.Event()

    async def main() -> int:
        first = asyncio.ensure_future(turns.run(_on_thread(gauge.work, 1, 0, release)))
        await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(turns.run(_on_thread(gauge.work, 2)))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        await first
        return await asyncio.wait_for(turns.run(_on_thread(gauge.work, 3)), 2)

    assert asyncio.run(main()) == 3
    assert gauge.started == [1, 3]


def test_the_server_takes_its_bound_from_the_settings(settings: Any) -> None:
    from config.handler import SyncChainASGIHandler

    settings.REQUEST_THREADS, settings.REQUEST_TURN_SECONDS = 3, 0.5
    handler = SyncChainASGIHandler()
    assert (handler.turns.size, handler.turns.turn) == (3, 0.5)
