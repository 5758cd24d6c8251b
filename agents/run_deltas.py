"""A run's model text as it streams: masked in the worker, then sent to the run's watchers as ``message.delta``.

The model gateway (pure, in ``llm/``) calls a :class:`~llm.streaming.DeltaListener` for each attempt on a
streaming provider; this one masks the text with :class:`~audit.stream_masking.StreamMasker` (the same
patterns as the trace, never releasing part of a secret split across pieces) and publishes what may be
released through :func:`core.live.publish_run_delta`. Nothing here is stored: the final message is
committed with its step as always.

Frame: ``{"type": "message.delta", "step": n, "attempt": k, "offset": i, "text": "..."}``. ``offset`` is
where ``text`` starts in the attempt's masked text, so a client sees when deltas were dropped; a higher
``attempt`` for the same step means the earlier attempt's text was abandoned (a retry or failover).
"""

from __future__ import annotations

from typing import Any

from audit.stream_masking import StreamMasker
from core import live
from runtime.types import ModelRequest

STREAMED_TASKS = frozenset({"act"})  # the loop's own calls; not summaries or other helper calls


class _NoSink:
    def write(self, text: str) -> None:
        return

    def close(self) -> None:
        return


class _RunDeltaSink:
    def __init__(self, run_id: Any, step: int, attempt: int) -> None:
        self.run_id = run_id
        self.step = step
        self.attempt = attempt
        self.offset = 0
        self.masker = StreamMasker()

    def write(self, text: str) -> None:
        self._publish(self.masker.feed(text))

    def close(self) -> None:
        self._publish(self.masker.finish())

    def _publish(self, text: str) -> None:
        if not text:
            return
        frame = {"type": "message.delta", "step": self.step, "attempt": self.attempt, "offset": self.offset, "text": text}
        self.offset += len(text)
        live.publish_run_delta(run_id=self.run_id, frame=frame)


class RunDeltas:
    """The :class:`~llm.streaming.DeltaListener` of one run."""

    def __init__(self, run_id: Any) -> None:
        self.run_id = run_id

    def open(self, request: ModelRequest, attempt: int) -> _RunDeltaSink | _NoSink:
        if request.task not in STREAMED_TASKS:
            return _NoSink()
        return _RunDeltaSink(self.run_id, int(request.metadata.get("step") or 0), attempt)
