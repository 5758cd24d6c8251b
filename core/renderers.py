"""The API's JSON responses encoded by orjson (``REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"]``).

DRF's ``JSONRenderer`` encodes through the standard library's pure-Python encoder (``JSONEncoder.iterencode``: 4.5 %
of a server's CPU in ``bench/api_profile.py`` under the API benchmark's load). This renderer writes the same document:
compact, UTF-8 characters as they are, U+2028/U+2029 escaped as DRF escapes them, datetimes in UTC ending in ``Z`` as
DRF's encoder writes them, and whatever orjson does not know (``Decimal``, lazy strings, sets, generators) through DRF's
own encoder's ``default``. Anything orjson refuses (an integer beyond 64 bits, a lone surrogate) and every indented
rendering (``Accept: application/json; indent=4``, the browsable API) go through DRF's renderer as before. One
difference on purpose: a float that is not a number (NaN, infinity) is written ``null`` where DRF's strict renderer
would fail the response with a 500 (JSON has no such numbers; the API refuses them on the way in).
"""

from __future__ import annotations

from typing import Any

import orjson
from rest_framework.renderers import JSONRenderer
from rest_framework.utils import encoders

_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z  # integer keys as strings; "…Z" as DRF's encoder writes UTC
_LINE_SEPARATORS = ((b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))  # U+2028, U+2029 in UTF-8
_default = encoders.JSONEncoder().default


class FastJSONRenderer(JSONRenderer):
    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if data is None:
            return b""
        if self.ensure_ascii or not self.compact or self.get_indent(accepted_media_type, renderer_context or {}) is not None:
            return bytes(super().render(data, accepted_media_type, renderer_context))
        try:
            text = orjson.dumps(data, default=_default, option=_OPTIONS)
        except (orjson.JSONEncodeError, TypeError):
            return bytes(super().render(data, accepted_media_type, renderer_context))
        if b"\xe2\x80" in text:  # a JavaScript-safe subset of JSON, as DRF writes it
            for raw, escaped in _LINE_SEPARATORS:
                text = text.replace(raw, escaped)
        return text
