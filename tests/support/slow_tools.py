"""Test-only tools that take a while, so a live-stack test can act in the middle of a run.

Loaded by the live stack's processes through ``AGENTOPS_EXTRA_TOOL_MODULES`` (the operators'
feature for site-specific tools) and imported by the tests that install them for a tenant.

The deterministic planner chains them: ``slow_fetch`` needs only the order number the user
gave; ``slow_confirm`` needs the ticket that only ``slow_fetch``'s result carries, so a run asking
for both takes three steps (fetch, confirm, answer), two of them slow.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

from tools.pyfunc import Param, tool

#: Seconds each call sleeps (the live stack's lease is 8 s by default: keep a step well below it).
SLOW_SECONDS = float(os.environ.get("TEST_SLOW_TOOL_SECONDS", "2"))

#: A live stack's directory where each call leaves a file as it begins (``LiveStack.slow_calls_begun``): a node's row says
#: "running" when its task is queued, a file here says its call has begun.
MARKS = os.environ.get("TEST_SLOW_TOOL_MARKS", "")


def _begun(name: str) -> None:
    if MARKS:
        Path(MARKS).mkdir(parents=True, exist_ok=True)
        (Path(MARKS) / f"{name}-{uuid.uuid4().hex}").touch()


SLOW_TOOL_KEYS = ["test_slow.slow_fetch", "test_slow.slow_confirm"]
ORDER = Param(description="The order number, e.g. O202411280001.", pattern=r"^O\d{12}$")
TICKET = Param(description="The ticket slow_fetch returned, e.g. TKT-280001.", pattern=r"^TKT-\d{6}$")


@tool(key="test_slow.slow_fetch", category="read")
def slow_fetch(order_id: Annotated[str, ORDER]) -> dict[str, Any]:
    """Slowly fetch a ticket for an order (test tool). Use it when the user asks to fetch a ticket."""
    _begun("slow_fetch")
    time.sleep(SLOW_SECONDS)
    return {"order_id": order_id, "ticket": f"TKT-{order_id[-6:]}"}


@tool(key="test_slow.slow_confirm", category="read")
def slow_confirm(ticket: Annotated[str, TICKET]) -> dict[str, Any]:
    """Slowly confirm a ticket (test tool). Use it when the user asks to confirm the ticket."""
    _begun("slow_confirm")
    time.sleep(SLOW_SECONDS)
    return {"ticket": ticket, "confirmed": True}
