"""The seam through which a model's text leaves the gateway while the provider is still writing it.

The gateway knows nothing of runs, masking or websockets: a caller hands ``complete`` a
:class:`DeltaListener`; for each attempt on a provider that streams, the gateway opens a
:class:`DeltaSink` and the client writes each text fragment to it as it arrives. Attempts are
numbered across the whole call (retries and failovers included), so a listener that sees a new
attempt knows the text of the previous one was abandoned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from runtime.types import ModelRequest, ModelResponse

OnText = Callable[[str], None]


class DeltaSink(Protocol):
    def write(self, text: str) -> None: ...

    def close(self) -> None:
        """The attempt ended (answered or failed): flush whatever is held back."""


class DeltaListener(Protocol):
    def open(self, request: ModelRequest, attempt: int) -> DeltaSink: ...


@runtime_checkable
class TextStreamingClient(Protocol):
    """A ModelClient that can also hand out its text as it streams (the OpenAI-compatible one)."""

    def complete_streaming(self, request: ModelRequest, on_text: OnText) -> ModelResponse: ...
