"""Compact JSON text on the step's hot path (the step's rows as one parameter, each event frame's websocket text).

orjson writes the same text as ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))`` for JSON-shaped
data at a tenth of the CPU (``bench/step_overhead.py``: about 60 µs a tool step). What it refuses — an integer
beyond 64 bits, a string with a lone surrogate — goes through the standard library as before, so nothing that
encoded before fails now. Text for hashes and signatures (the audit chain, argument hashes) keeps its own
canonical encoder: this one promises valid JSON, not byte-for-byte stability across versions.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS  # integer keys as strings, as json.dumps writes them


def dumps(value: Any) -> str:
    """``value`` as compact JSON text (UTF-8 characters as they are, no spaces)."""
    try:
        return orjson.dumps(value, option=_OPTIONS).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
