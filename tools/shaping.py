"""Shape a tool's raw result into what the model reads next.

- a field whitelist keeps only the listed fields (dotted paths for nested objects; applied to
  every item of lists met on the way);
- the result is serialised as compact JSON and cut at a byte cap with an explicit marker;
- an optional summary template (``str.format`` style, ``{field}`` / ``{customer.name}``
  placeholders) renders a sentence; fields the tool did not return are stated as missing
  ("refund_amount: not provided by the tool") rather than invented.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.numbers import whole_number

__all__ = ["DEFAULT_SIZE_CAP", "NOT_PROVIDED", "ShapedResult", "apply_whitelist", "render_summary", "shape_result"]

DEFAULT_SIZE_CAP = 8000
NOT_PROVIDED = "not provided by the tool"


@dataclass
class ShapedResult:
    content: str
    original_size: int
    truncated: bool
    missing_fields: list[str] = field(default_factory=list)


class _Missing:
    pass


_MISSING = _Missing()


def _serialise(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


# --------------------------------------------------------------------------- whitelist


def _path_present(data: Any, parts: Sequence[str]) -> bool:
    if not parts:
        return True
    if isinstance(data, list):
        return any(_path_present(item, parts) for item in data)
    if isinstance(data, Mapping) and parts[0] in data:
        return _path_present(data[parts[0]], parts[1:])
    return False


def _pick(data: Any, tree: dict[str, Any]) -> Any:
    if isinstance(data, list):
        return [_pick(item, tree) for item in data]
    if not isinstance(data, Mapping):
        return data
    out: dict[str, Any] = {}
    for key, sub in tree.items():
        if key not in data:
            continue
        out[key] = data[key] if sub is None else _pick(data[key], sub)
    return out


def _tree(paths: Sequence[str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        parts = [p for p in path.split(".") if p]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if last:
                node[part] = None  # the whole subtree
            else:
                existing = node.get(part, {})
                if existing is None:
                    break  # a shorter path already keeps everything below
                node[part] = existing
                node = existing
    return tree


def apply_whitelist(data: Any, paths: Sequence[str]) -> tuple[Any, list[str]]:
    """(data with only ``paths`` kept, paths absent from the data)."""
    missing = [p for p in paths if not _path_present(data, [x for x in p.split(".") if x])]
    return _pick(data, _tree(paths)), missing


# --------------------------------------------------------------------------- template


#: The largest width or precision a summary template's format spec may ask for (the template is a tenant's input).
MAX_SPEC_NUMBER = 200
_SPEC_NUMBER = re.compile(r"\d+")


class _SummaryFormatter(string.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self.missing: list[str] = []

    def get_field(self, field_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, str]:
        value: Any = kwargs
        for part in field_name.replace("[", ".").replace("]", "").split("."):
            if isinstance(value, Mapping) and part in value:
                value = value[part]
            elif isinstance(value, list) and _index(part) is not None and -len(value) <= int(part) < len(value):
                value = value[int(part)]
            else:
                value = _MISSING
                break
        if value is None or value is _MISSING:
            if field_name not in self.missing:
                self.missing.append(field_name)
            value = _MISSING
        return value, field_name

    def format_field(self, value: Any, format_spec: str) -> str:
        if value is _MISSING:
            return f"[{NOT_PROVIDED}]"
        if isinstance(value, dict | list):
            return _serialise(value)
        if any(len(n) > 3 or int(n) > MAX_SPEC_NUMBER for n in _SPEC_NUMBER.findall(format_spec)):
            return str(value)  # a width or precision such as {count:>999999999} would make a gigabyte
        try:
            return super().format_field(value, format_spec)
        except (ValueError, TypeError):
            return str(value)


def _template_context(data: Any) -> dict[str, Any]:
    if isinstance(data, Mapping):
        return dict(data)
    if isinstance(data, list):
        return {"items": data, "count": len(data), "first": data[0] if data else None}
    return {"result": data, "value": data}


def render_summary(template: str, data: Any) -> tuple[str, list[str]]:
    """(rendered sentence, placeholders that had no value). Lists expose {count}, {items}, {first.x}."""
    formatter = _SummaryFormatter()
    try:
        text = formatter.format(template, **_template_context(data))
    except (IndexError, KeyError, ValueError) as exc:  # a broken template: say so rather than crash
        return f"(summary template error: {exc})", []
    return text, formatter.missing


# --------------------------------------------------------------------------- the shaper


def _cut(text: str, cap: int) -> tuple[str, bool]:
    raw = text.encode("utf-8")
    total = len(raw)
    if total <= cap:
        return text, False
    keep = cap
    for _ in range(3):  # the marker's own length depends on the number it shows
        marker = f"…[truncated: showing {keep} of {total} bytes]"
        keep = max(0, cap - len(marker.encode("utf-8")))
    kept = raw[:keep].decode("utf-8", errors="ignore")
    kept_bytes = len(kept.encode("utf-8"))
    return f"{kept}…[truncated: showing {kept_bytes} of {total} bytes]", True


def shape_result(
    result: Any,
    *,
    field_whitelist: Sequence[str] | None = None,
    size_cap: int = DEFAULT_SIZE_CAP,
    summary_template: str | None = None,
    include_data: bool = True,
) -> ShapedResult:
    """Shape ``result`` for the model.

    ``content`` is the summary sentence (if a template is given) followed by one line per
    missing field, then the (whitelisted) data as compact JSON (unless ``include_data`` is false
    and a summary exists), all within ``size_cap`` bytes (UTF-8). ``original_size`` is the
    byte size of the raw result serialised as compact JSON.
    """
    original_text = _serialise(result)
    original_size = len(original_text.encode("utf-8"))

    data = result
    if isinstance(result, str) and (field_whitelist or summary_template):
        try:
            data = json.loads(result)
        except ValueError:
            data = result
    missing: list[str] = []
    if field_whitelist and isinstance(data, Mapping | list):
        data, missing = apply_whitelist(data, list(field_whitelist))

    parts: list[str] = []
    if summary_template:
        sentence, template_missing = render_summary(summary_template, data)
        for name in template_missing:
            if name not in missing:
                missing.append(name)
        parts.append(sentence)
        parts.extend(f"{name}: {NOT_PROVIDED}" for name in template_missing)
    elif missing:
        parts.extend(f"{name}: {NOT_PROVIDED}" for name in missing)
    if include_data or not summary_template:
        parts.append(_serialise(data))

    content, truncated = _cut("\n".join(parts), max(0, int(size_cap)))
    return ShapedResult(content=content, original_size=original_size, truncated=truncated, missing_fields=missing)


def _index(part: str) -> int | None:
    """A list index in a field name (``items[0]``, ``items[-1]``): ASCII digits, optionally negative."""
    number = whole_number(part.removeprefix("-"), digits=9)
    return None if number is None else (-number if part.startswith("-") else number)
