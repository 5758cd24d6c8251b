"""Server-Sent Events: lines in, messages out (https://html.spec.whatwg.org/multipage/server-sent-events.html)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    data: str
    id: str | None
    event: str


def messages(lines: Iterable[str]) -> Iterator[Message]:
    """Each complete message (ended by a blank line); comments and a message cut off by a dropped connection are not."""
    data: list[str] = []
    event_id: str | None = None
    event = "message"
    for line in lines:
        if line == "":
            if data:
                yield Message("\n".join(data), event_id, event)
            data, event_id, event = [], None, "message"
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "id" and "\x00" not in value:
            event_id = value
        elif name == "event":
            event = value
