"""What every tool executor shares: the call's context, the failure the model reads, secret resolution.

Each kind's executor is in its module (``tools/kinds/<kind>.py``, one table in ``tools/kinds``).
An executor gets the Tool row, the validated arguments and an ExecContext, and returns the raw
result (any JSON-able value) or raises. The gateway around it owns timeouts, bulkheads, shaping
and audit; executors only do the call, and end it by ``ctx.deadline`` where they can (an HTTP
request is bounded by it, a process-isolated Python tool is killed at it, a cooperative one sees
``ctx.cancel``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from tools.models import Tool


@dataclass(frozen=True)
class ExecContext:
    tenant_id: int
    run: Any
    step: int
    call_id: str
    span_id: str
    idempotency_key: str | None = None
    #: Outbound hosts/CIDRs this call may reach besides the public internet (operator allow-list).
    egress_allow: tuple[str, ...] = field(default_factory=tuple)
    #: Set by the gateway when the call's time is up; a long-running executor stops when it sees it (``tools.cancel``).
    cancel: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    #: ``time.monotonic()`` at which the gateway stops waiting for the call (None: no deadline).
    deadline: float | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()


class ToolFailure(Exception):
    """A failure the model should read, with the audit status to record (e.g. ``egress_denied``)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


Executor = Callable[[Tool, dict[str, Any], ExecContext], Any]


def resolve_secret(name: str) -> str:
    """``secret:NAME`` header values come from the environment variable ``TOOL_SECRET_<NAME>`` (read at start-up)."""
    value = settings.TOOL_SECRETS.get(name)
    if value is None:
        from tools.http_exec import SecretUnavailable

        raise SecretUnavailable(f"the secret {name} is not configured (set TOOL_SECRET_{name})")
    return value
