"""Argument extraction for the deterministic planner, driven by each tool's JSON Schema.

Order of precedence, so that the most specific evidence claims its text first: properties
with a ``pattern`` (matched unanchored, on token boundaries), dates (``format: date``),
enums (by mention), numbers, then free strings by cue words (``from X to Y``, ``因为…``,
``booking ABC123``). Spans claimed by one property are not reused by another.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache
from typing import Any

from llm.intent import CACHED_TEXT, kept_or_fresh, split_name

Span = tuple[int, int]

_MONTHS = {
    m: i + 1
    for i, names in enumerate(
        [
            ("jan", "january"),
            ("feb", "february"),
            ("mar", "march"),
            ("apr", "april"),
            ("may",),
            ("jun", "june"),
            ("jul", "july"),
            ("aug", "august"),
            ("sep", "sept", "september"),
            ("oct", "october"),
            ("nov", "november"),
            ("dec", "december"),
        ]
    )
    for m in names
}
_MONTH_RE = "|".join(sorted(_MONTHS, key=len, reverse=True))
_WEEKDAYS = {"monday": 0, "tuesday": 1, "wednesday": 2, "thursday": 3, "friday": 4, "saturday": 5, "sunday": 6}
_CN_WEEKDAYS = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}
_RELATIVE = (
    (r"day after tomorrow|后天", 2),
    (r"tomorrow|明天|明日", 1),
    (r"today|今天|今日", 0),
    (r"yesterday|昨天", -1),
)
_DATE_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(?<!\d)(\d{4})\s*[-/.年]\s*(\d{1,2})\s*[-/.月]\s*(\d{1,2})\s*[日号]?(?!\d)"), "ymd"),
    (re.compile(r"(?<!\d)(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]"), "md_cn"),
    (re.compile(rf"\b({_MONTH_RE})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s*(\d{{4}}))?\b", re.IGNORECASE), "mon_d"),
    (
        re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH_RE})\b\.?(?:,?\s*(\d{{4}}))?", re.IGNORECASE),
        "d_mon",
    ),
]
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?!\w|\.\d)")
_CODE = re.compile(r"(?<![A-Za-z0-9])(?=[A-Za-z0-9-]*\d)(?=[A-Za-z0-9-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9-]{3,}(?![A-Za-z0-9])")
_STOP_PLACE = r"(?=\s+(?:on|at|for|by|in|tomorrow|today|next|this|via|and|please)\b|\s*[,.?!;，。？！]|\s+\d|$)"
_PLACE_EN = r"([A-Za-z][\w.'-]*(?:\s+(?!on\b|at\b|for\b|to\b|by\b|in\b|and\b|tomorrow\b|today\b)[A-Za-z][\w.'-]*){0,2}?)"
_CJK_PLACE = r"([\u4e00-\u9fff]{2,4}?)"
_CN_STOP = r"(?=的|，|,|。|？|\?|！|\s|$|今天|明天|后天|航班|机票|\d)"
#: property-name words -> regexes whose first group is the value.
_CUES: list[tuple[frozenset[str], list[re.Pattern[str]]]] = [
    (
        frozenset({"origin", "from", "source", "departure", "depart", "src"}),
        [
            re.compile(rf"\bfrom\s+{_PLACE_EN}(?=\s+to\b)", re.IGNORECASE),
            re.compile(rf"\bfrom\s+{_PLACE_EN}{_STOP_PLACE}", re.IGNORECASE),
            re.compile(rf"从\s*{_CJK_PLACE}\s*(?=到|飞|去|至|出发)"),
            re.compile(rf"{_CJK_PLACE}(?=飞往|飞|到|至)"),
        ],
    ),
    (
        frozenset({"destination", "dest", "to", "arrival", "arrive", "target"}),
        [
            re.compile(rf"\bto\s+{_PLACE_EN}{_STOP_PLACE}", re.IGNORECASE),
            re.compile(rf"(?:飞往|到|去|至|飞)\s*{_CJK_PLACE}{_CN_STOP}"),
        ],
    ),
    (
        frozenset({"reason", "note", "comment", "why", "remark"}),
        [
            re.compile(r"\b(?:because|since|due to|as)\s+(.+?)\s*(?:[.!?]|$)", re.IGNORECASE),
            re.compile(r"\breason\s*(?:is|:)?\s*[:：]?\s*(.+?)\s*(?:[.!?]|$)", re.IGNORECASE),
            re.compile(r"(?:因为|原因是|原因[:：]|理由是|理由[:：])\s*(.+?)\s*(?:[。！？!?]|$)"),
        ],
    ),
]
_CODE_SUFFIXES = frozenset({"id", "ref", "reference", "no", "code", "number", "num", "sn"})


@dataclass
class Extraction:
    arguments: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def _bounded(pattern: str) -> re.Pattern[str] | None:
    core = pattern.removeprefix("^").removesuffix("$")
    try:
        return re.compile(rf"(?<![A-Za-z0-9]){core}(?![A-Za-z0-9])")
    except re.error:
        return None


def _free(span: Span, claimed: list[Span]) -> bool:
    return all(span[1] <= a or span[0] >= b for a, b in claimed)


def _find_all(regex: re.Pattern[str], text: str, claimed: list[Span]) -> list[tuple[str, Span]]:
    return [(m.group(0), m.span()) for m in regex.finditer(text) if _free(m.span(), claimed)]


def find_dates(text: str, today: date) -> list[tuple[str, Span]]:
    """Every date mentioned, as ``YYYY-MM-DD``, in order of appearance (impossible dates kept as written). The planner
    extracts every scored tool's arguments from the same message: the dates are found once per (text, day)."""
    return list(kept_or_fresh(_dates, len(text) <= CACHED_TEXT, text, today))  # a message is a user's input


@lru_cache(maxsize=256)
def _dates(text: str, today: date) -> tuple[tuple[str, Span], ...]:
    found: list[tuple[int, str, Span]] = []
    taken: list[Span] = []
    for regex, shape in _DATE_PATTERNS:
        for m in regex.finditer(text):
            if not _free(m.span(), taken):
                continue
            if shape == "ymd":
                y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
            elif shape == "md_cn":
                y, mo, d = today.year, int(m.group(1)), int(m.group(2))
            elif shape == "mon_d":
                y, mo, d = int(m.group(3) or today.year), _MONTHS[m.group(1).lower()], int(m.group(2))
            else:
                y, mo, d = int(m.group(3) or today.year), _MONTHS[m.group(2).lower()], int(m.group(1))
            taken.append(m.span())
            found.append((m.start(), f"{y:04d}-{mo:02d}-{d:02d}", m.span()))
    for pattern, offset in _RELATIVE:
        for m in re.finditer(pattern, text, re.IGNORECASE):
            if _free(m.span(), taken):
                taken.append(m.span())
                found.append((m.start(), (today + timedelta(days=offset)).isoformat(), m.span()))
    for m in re.finditer(r"\b(next\s+|this\s+|on\s+)?(monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b", text, re.I):
        ahead = (_WEEKDAYS[m.group(2).lower()] - today.weekday()) % 7 or 7
        if (m.group(1) or "").strip().lower() == "next" and ahead < 7:
            ahead += 7 if _WEEKDAYS[m.group(2).lower()] <= today.weekday() else 0
        found.append((m.start(), (today + timedelta(days=ahead)).isoformat(), m.span()))
    for m in re.finditer(r"(下周|下星期|这周|本周|周|星期)([一二三四五六日天])", text):
        if not _free(m.span(), taken):
            continue
        target = _CN_WEEKDAYS[m.group(2)]
        base = today - timedelta(days=today.weekday())
        if m.group(1) in ("下周", "下星期"):
            day = base + timedelta(days=7 + target)
        else:
            day = base + timedelta(days=target)
            if day < today and m.group(1) in ("周", "星期"):
                day += timedelta(days=7)
        found.append((m.start(), day.isoformat(), m.span()))
    return tuple((value, span) for _, value, span in sorted(found))


def _enum_mentions(values: list[Any], text: str) -> list[tuple[Any, Span]]:
    hits: list[tuple[Any, Span]] = []
    for value in values:
        forms = {str(value), str(value).replace("_", " "), str(value).replace("-", " ")}
        for form in forms:
            m = re.search(rf"(?<![A-Za-z0-9]){re.escape(form)}(?![A-Za-z0-9])", text, re.IGNORECASE)
            if m:
                hits.append((value, m.span()))
                break
    return sorted(hits, key=lambda h: h[1][0])


def _cue_words(name: str, schema: dict[str, Any]) -> set[str]:
    words = set(split_name(name))
    words.update(w.lower() for w in schema.get("x-keywords", []) if isinstance(w, str))
    return words


def _code_after_cue(name: str, schema: dict[str, Any], text: str, claimed: list[Span]) -> tuple[str, Span] | None:
    cues = [w for w in _cue_words(name, schema) if w not in _CODE_SUFFIXES] or list(_cue_words(name, schema))
    for cue in cues:
        regex = re.compile(
            rf"{re.escape(cue)}\w*\s*(?:no\.?|number|id|ref|code|#|is|:|：)?\s*#?\s*([A-Za-z0-9][A-Za-z0-9-]{{2,}})",
            re.I,
        )
        for m in regex.finditer(text):
            span = m.span(1)
            if _free(span, claimed) and re.search(r"\d", m.group(1)):
                return m.group(1), span
    for value, span in _find_all(_CODE, text, claimed):
        return value, span
    return None


_FILLER = re.compile(r"今天|明天|后天|今日|明日|昨天|帮我|帮忙|请|查一下|查询|我要|我想|一下")


def _string_by_cue(name: str, text: str, claimed: list[Span]) -> tuple[str, Span] | None:
    words = set(split_name(name))
    text = _FILLER.sub(lambda m: " " * len(m.group(0)), text)  # same length: spans stay valid
    for names, patterns in _CUES:
        if not words & names:
            continue
        for regex in patterns:
            for m in regex.finditer(text):
                span = m.span(1)
                value = m.group(1).strip(" ,.;:'\"")
                if value and _free(span, claimed):
                    return value, span
    return None


def _number(kind: str, name: str, text: str, claimed: list[Span]) -> tuple[int | float, Span] | None:
    candidates = [(m.group(0), m.span()) for m in _NUMBER.finditer(text) if _free(m.span(), claimed)]
    if not candidates:
        return None
    cues = split_name(name)
    best = candidates[0]
    for raw, span in candidates:
        window = text[max(0, span[0] - 24) : span[1] + 24].lower()
        if any(c in window for c in cues):
            best = (raw, span)
            break
    raw, span = best
    if kind == "integer":
        if "." in raw:
            return None
        return int(raw), span
    return (float(raw) if "." in raw else int(raw)), span


def extract_arguments(parameters: dict[str, Any], text: str, *, today: date | Callable[[], datetime] | None = None) -> Extraction:
    """Fill the schema's properties from ``text``; list the required ones that could not be found."""
    if callable(today):
        today = today().date()
    today = today or date.today()
    properties: dict[str, dict[str, Any]] = dict(parameters.get("properties") or {})
    required = [r for r in parameters.get("required") or [] if r in properties]
    result = Extraction()
    claimed: list[Span] = []

    def put(name: str, value: Any, spans: list[Span]) -> None:
        result.arguments[name] = value
        claimed.extend(spans)

    def kind_of(schema: dict[str, Any]) -> str:
        kind = schema.get("type", "string")
        return str(kind[0] if isinstance(kind, list) else kind)

    pending = list(properties)
    # 1. patterns (scalar or array items)
    for name in list(pending):
        schema = properties[name]
        item_schema = schema.get("items") or {} if kind_of(schema) == "array" else schema
        regex = _bounded(item_schema["pattern"]) if isinstance(item_schema.get("pattern"), str) else None
        if regex is None:
            continue
        hits = _find_all(regex, text, claimed)
        if hits and kind_of(schema) == "array":
            values = list(dict.fromkeys(h[0] for h in hits))
            put(name, values, [h[1] for h in hits])
        elif hits:
            put(name, hits[0][0], [hits[0][1]])
        pending.remove(name)
    # 2. dates, in order of appearance, to the date properties in schema order
    date_props = [
        n
        for n in pending
        if properties[n].get("format") in ("date", "date-time") or (kind_of(properties[n]) == "string" and "date" in split_name(n))
    ]
    dates = [d for d in find_dates(text, today) if _free(d[1], claimed)]
    for name, (value, span) in zip(date_props, dates, strict=False):
        put(name, value, [span])
    for name in date_props:
        pending.remove(name)
    # 3. enums
    for name in list(pending):
        schema = properties[name]
        options = schema.get("enum") or (schema.get("items") or {}).get("enum")
        if not options:
            continue
        hits = [h for h in _enum_mentions(list(options), text) if _free(h[1], claimed)]
        if hits and kind_of(schema) == "array":
            put(name, [h[0] for h in hits], [h[1] for h in hits])
        elif hits:
            put(name, hits[0][0], [hits[0][1]])
        pending.remove(name)
    # 4. numbers
    for name in list(pending):
        kind = kind_of(properties[name])
        if kind not in ("integer", "number"):
            continue
        found = _number(kind, name, text, claimed)
        if found is not None:
            put(name, found[0], [found[1]])
        pending.remove(name)
    # 5. free strings: cue phrases, then code-like tokens for *_id / *_ref / *_no properties
    for name in list(pending):
        if kind_of(properties[name]) != "string":
            continue
        cue = _string_by_cue(name, text, claimed)
        if cue is None and set(split_name(name)) & _CODE_SUFFIXES:
            cue = _code_after_cue(name, properties[name], text, claimed)
        if cue is not None:
            put(name, cue[0], [cue[1]])
    result.missing = [r for r in required if r not in result.arguments]
    return result
