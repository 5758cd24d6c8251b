"""A circuit breaker per provider: closed -> open (after N consecutive failures) -> half-open -> closed.

While open, calls to the provider are skipped (the gateway fails over at once). After the
cool-down one probe call is let through (half-open): success closes the circuit, failure
opens it for another cool-down. Only failures that say something about the provider's
health count (connection errors, timeouts, 5xx), not a refused key or an unknown model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


@dataclass
class _State:
    failures: int = 0
    opened_at: float | None = None
    probing: bool = False


class CircuitBreaker:
    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        cooldown_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, got {failure_threshold}")
        self.failure_threshold = failure_threshold
        self.cooldown_seconds = cooldown_seconds
        self._clock = clock
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()

    def state(self, provider: str) -> str:
        with self._lock:
            return self._state_of(self._states.get(provider) or _State())

    def _state_of(self, state: _State) -> str:
        if state.opened_at is None:
            return CLOSED
        if self._clock() - state.opened_at >= self.cooldown_seconds:
            return HALF_OPEN
        return OPEN

    def allow(self, provider: str) -> tuple[bool, float]:
        """May a call go to ``provider`` now? Returns ``(allowed, seconds until it may)``."""
        with self._lock:
            state = self._states.setdefault(provider, _State())
            current = self._state_of(state)
            if current == CLOSED:
                return True, 0.0
            if current == HALF_OPEN and not state.probing:
                state.probing = True
                return True, 0.0
            assert state.opened_at is not None
            return False, max(0.0, state.opened_at + self.cooldown_seconds - self._clock())

    def record_success(self, provider: str) -> None:
        with self._lock:
            self._states[provider] = _State()

    def record_failure(self, provider: str) -> bool:
        """Count a health failure; returns True when this failure opened (or re-opened) the circuit."""
        with self._lock:
            state = self._states.setdefault(provider, _State())
            state.failures += 1
            if state.probing or (state.opened_at is None and state.failures >= self.failure_threshold):
                state.opened_at = self._clock()
                state.probing = False
                return True
            return False

    def release(self, provider: str) -> None:
        """A probe ended without a verdict (e.g. a non-health error): let the next call probe again."""
        with self._lock:
            state = self._states.get(provider)
            if state is not None:
                state.probing = False

    def snapshot(self) -> dict[str, dict[str, object]]:
        with self._lock:
            return {name: {"state": self._state_of(s), "consecutive_failures": s.failures} for name, s in self._states.items()}
