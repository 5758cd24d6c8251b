"""Python tools that exist only for tests (registered under ``test.*`` keys when imported)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from tools.pyfunc import Param, registry, tool

if "test.slow" not in registry:

    @tool(key="test.slow", category="read")
    def slow(seconds: float) -> dict[str, Any]:
        """Sleep, then answer. Used to test timeouts and mid-run behaviour."""
        time.sleep(seconds)
        return {"slept": seconds}

    @tool(key="test.note", category="write", idempotent=False)
    def note(text: Annotated[str, Param(description="What to write down.")]) -> dict[str, Any]:
        """Write a note (a side effect). Used to test the duplicate guard."""
        return {"written": text}

    @tool(key="test.contact", category="read")
    def contact(phone: str, name: str) -> dict[str, Any]:
        """Echo a contact back. Used to test masking."""
        return {"phone": phone, "name": name, "card": "4111 1111 1111 1111"}
