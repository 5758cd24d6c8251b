"""The API's JSON parser: bounded in size (413) and in nesting depth (400), so no body can exhaust the stack or memory.

It also refuses NUL characters in strings (``\\u0000``): PostgreSQL cannot store them, so they would be a 500 later;
lone UTF-16 surrogates (``\\ud800``), which no UTF-8 text (a database's, a response's) can hold; and numbers too large
for a double (``1e400`` decodes to infinity, which is not JSON and no JSON column stores).

DRF's own parser hands the request stream to ``json.load`` unread: Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is
never consulted, and JSON nested a few thousand levels deep raises ``RecursionError`` (a 500) in the decoder or,
worse, later in code that walks the value (masking, validation). This parser reads at most the configured number
of bytes and measures the nesting before decoding.
"""

from __future__ import annotations

import codecs
import io
import math
import re
from collections.abc import Callable
from itertools import accumulate
from json import JSONDecodeError
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.forms.fields import InvalidJSONInput, JSONString
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
#: An escaped UTF-16 surrogate (``\\ud83d``); a well-formed pair decodes to one character, a lone one stays.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


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
    return _any_text(value, lambda text: "\x00" in text)


def contains_surrogate(value: Any) -> bool:
    """Whether a lone UTF-16 surrogate is in any key or string of ``value`` (it cannot be encoded as UTF-8)."""
    return _any_text(value, lambda text: _SURROGATE.search(text) is not None)


def _finite(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"the number {number[:40]} is beyond the largest a double holds (about 1.8e308); send a "
                         "smaller one or send it as a string")
    return value


def _any_text(value: Any, test: Callable[[str], bool]) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if test(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class OutOfBounds(ValueError):
    """Well-formed JSON past the bounds (nesting, NUL, a lone surrogate); the message says which, and what to send."""


def loads_bounded(text: str, *, strict: bool = True) -> Any:
    """JSON within the API body's bounds (nesting, no NaN or infinity, no lone surrogate, no NUL): the one decoder of
    request bodies and of JSON typed into forms. :class:`OutOfBounds` says what is wrong; malformed JSON, and a number
    past a double, are the decoder's ``ValueError`` (``JSONDecodeError`` when malformed). ``strict=False`` takes
    ``NaN`` and ``Infinity`` (DRF's ``STRICT_JSON`` off)."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise OutOfBounds(f"JSON nested deeper than {MAX_JSON_DEPTH} levels (this nests {depth}); flatten the data")
    value = json.loads(text, parse_constant=json.strict_constant if strict else None, parse_float=_finite)
    if "\\u0000" in text and contains_nul(value):
        raise OutOfBounds("text may not contain NUL (\\u0000) characters")
    if _SURROGATE_ESCAPE.search(text) and contains_surrogate(value):
        raise OutOfBounds("text may not contain a lone UTF-16 surrogate (\\ud800 to \\udfff without its pair); send "
                          "valid Unicode text")
    return value


class JSONParser(parsers.JSONParser):
    """``application/json`` bodies up to ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes and :data:`MAX_JSON_DEPTH` levels."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        raw = read_bounded(stream, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        try:
            text = codecs.decode(raw, encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"The body is not valid {encoding} text: {exc}") from None
        try:
            return loads_bounded(text, strict=api_settings.STRICT_JSON)
        except OutOfBounds as exc:
            message = str(exc)
            raise ParseError(f"{message[0].upper()}{message[1:]}.") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


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


class BoundedJSONField(forms.JSONField):
    """A form's JSON field within the API body's bounds (``loads_bounded``): a value nested thousands deep, or holding a
    lone surrogate, is a form error instead of a ``RecursionError`` or a page that cannot be encoded."""

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and value.strip() and not self.disabled:
            try:
                decoded = loads_bounded(value)
            except JSONDecodeError:
                pass  # malformed: Django's own message says so
            except ValueError as exc:
                raise forms.ValidationError(f"Must be JSON within bounds: {exc}.", code="invalid") from None
            else:
                if self.decoder is None:  # what Django's own would make of it, without decoding it a second time
                    return JSONString(decoded) if isinstance(decoded, str) else decoded
        return super().to_python(value)

    def bound_data(self, data: Any, initial: Any) -> Any:
        """The form shown again: a value past the bounds as typed (Django's own decodes it again to show it)."""
        if isinstance(data, str) and not self.disabled:
            try:
                loads_bounded(data)
            except JSONDecodeError:
                pass
            except ValueError:
                return InvalidJSONInput(data)
        return super().bound_data(data, initial)
