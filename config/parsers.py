"""The API's JSON parser: bounded in size (413) and in nesting depth (400), so no body can exhaust the stack or memory.

It also refuses NUL characters in strings (``\\u0000``): PostgreSQL cannot store them, so they would be a 500 later.

DRF's own parser hands the request stream to ``json.load`` unread: Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is
never consulted, and JSON nested a few thousand levels deep raises ``RecursionError`` (a 500) in the decoder or,
worse, later in code that walks the value (masking, validation). This parser reads at most the configured number
of bytes and measures the nesting before decoding.
"""

from __future__ import annotations

import codecs
import io
import re
from itertools import accumulate
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.settings import api_settings
from rest_framework.utils import json

#: The deepest nesting of arrays and objects a request body may have (tool parameter schemas stay well inside).
MAX_JSON_DEPTH = 64

#: A JSON string, or an unterminated one up to the end: every match attempt succeeds, so the scan stays linear.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def too_big_message(limit: int) -> str:
    return f"The request body is larger than {limit} bytes, the most this API accepts. Send less data per request."


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in ``text`` (brackets inside strings do not count); linear, no recursion."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def read_bounded(stream: Any, limit: int) -> bytes:
    """At most ``limit`` bytes of ``stream``; :class:`RequestDataTooBig` (a 413) when there are more."""
    raw = stream.read(limit + 1) if stream is not None else b""
    if len(raw) > limit:
        raise RequestDataTooBig(too_big_message(limit))
    return raw


def contains_nul(value: Any) -> bool:
    """Whether a NUL character is in any key or string of ``value`` (PostgreSQL cannot store one); no recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class JSONParser(parsers.JSONParser):
    """``application/json`` bodies up to ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes and :data:`MAX_JSON_DEPTH` levels."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        raw = read_bounded(stream, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        try:
            text = codecs.decode(raw, encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"The body is not valid {encoding} text: {exc}") from None
        depth = json_depth(text)
        if depth > MAX_JSON_DEPTH:
            raise ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels (this body nests {depth}); flatten the data.")
        strict = api_settings.STRICT_JSON
        try:
            data = json.loads(text, parse_constant=json.strict_constant if strict else None)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        if "\\u0000" in text and contains_nul(data):
            raise ParseError("Text in the body may not contain NUL (\\u0000) characters.")
        return data


class FormParser(parsers.FormParser):
    """Form bodies, bounded like JSON (DRF's own reads the whole stream, whatever its size)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        raw = read_bounded(stream, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        return super().parse(io.BytesIO(raw), media_type, parser_context)


class MultiPartParser(parsers.MultiPartParser):
    """Multipart bodies, bounded by their declared length (Django bounds only the non-file fields)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        request = (parser_context or {}).get("request")
        meta = getattr(request, "META", {}) if request is not None else {}
        try:
            declared = int(meta.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
            raise RequestDataTooBig(too_big_message(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))
        return super().parse(stream, media_type, parser_context)
