"""A real websocket client for the tests (the ``websockets`` library)."""

from __future__ import annotations

import json
import time
from typing import Any

from websockets.sync.client import connect


def recv_frame(ws: Any, timeout: float) -> dict[str, Any]:
    """The next frame that is not the server's heartbeat (raises TimeoutError when none arrives in time)."""
    deadline = time.monotonic() + timeout
    while True:
        frame: dict[str, Any] = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if frame.get("type") != "heartbeat":
            return frame


def read_run_frames(url: str, *, key: str | None = None, headers: dict[str, str] | None = None,
                    until: str = "run.finished", timeout: float = 30) -> list[dict[str, Any]]:
    """Collect frames until one of type ``until`` arrives (or time runs out)."""
    all_headers = dict(headers or {})
    if key:
        all_headers["Authorization"] = f"Bearer {key}"
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    with connect(url, additional_headers=all_headers, open_timeout=10) as ws:
        while time.monotonic() < deadline:
            frame = recv_frame(ws, timeout=max(0.1, deadline - time.monotonic()))
            frames.append(frame)
            if frame.get("type") == until:
                return frames
    raise AssertionError(f"no {until} frame within {timeout}s; got {[f.get('type') for f in frames]}")
