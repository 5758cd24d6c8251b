"""Offline token counting: the encodings bundled by ``bpe-openai``; a character estimate otherwise."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

from runtime.types import Message, ToolSpec

#: Overhead the Chat Completions format adds per message (role, separators).
PER_MESSAGE_OVERHEAD = 4


class _Encoding(Protocol):
    def encode(self, text: str) -> list[int]: ...


@lru_cache(maxsize=32)
def _encoding_for(model: str) -> _Encoding | None:
    try:
        import bpe_openai
    except ImportError:  # pragma: no cover - the package is a pinned requirement
        return None
    name = model.split("/", 1)[-1]
    try:
        enc: _Encoding = bpe_openai.encoding_for_model(name)
        return enc
    except Exception:
        if name.startswith(("gpt-3.5", "gpt-4-", "text-embedding")) or name == "gpt-4":
            fallback: _Encoding = bpe_openai.get_encoding("cl100k_base")
            return fallback
        return None


def estimate_by_chars(text: str) -> int:
    """About four characters per token for Latin text, about one per CJK character."""
    cjk = sum(1 for ch in text if "\u3000" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af")
    return cjk + (len(text) - cjk + 3) // 4


#: Texts up to this length have their count remembered: a conversation's messages are counted again at every
#: step (compaction check, budget projection, usage), and counting is the runtime's largest CPU cost per step.
CACHED_TEXT_CHARS = 16_384


def count_tokens(text: str, model: str = "") -> int:
    if not text:
        return 0
    if len(text) <= CACHED_TEXT_CHARS:
        return _count_cached(text, model)
    return _count(text, model)


@lru_cache(maxsize=4096)
def _count_cached(text: str, model: str) -> int:
    return _count(text, model)


def _count(text: str, model: str) -> int:
    encoding = _encoding_for(model) if model else None
    if encoding is None:
        return estimate_by_chars(text)
    return len(encoding.encode(text))


def _message_text(message: Message) -> str:
    parts: list[str] = [str(message.get("content") or "")]
    calls: list[dict[str, Any]] = message.get("tool_calls") or []
    for call in calls:
        function = call.get("function", {})
        parts.append(str(function.get("name", "")))
        parts.append(str(function.get("arguments", "")))
    return "\n".join(p for p in parts if p)


def count_messages(messages: list[Message], model: str = "") -> int:
    # Counted several times a step over the whole conversation: a message without tool calls is its content as it
    # is (what ``_message_text`` would join), so its cached count is found without building a new string.
    total = PER_MESSAGE_OVERHEAD * len(messages)
    for message in messages:
        if message.get("tool_calls"):
            text = _message_text(message)
        else:
            content = message.get("content")
            text = content if type(content) is str else str(content or "")
        if text:
            total += count_tokens(text, model)
    return total


def count_tools(tools: list[dict[str, Any]], model: str = "") -> int:
    return count_tokens(json.dumps(tools, ensure_ascii=False), model) if tools else 0


def count_specs(tools: Sequence[ToolSpec], model: str = "") -> int:
    """``count_tools`` of the specs' OpenAI form (the same text, so the same count), each spec's JSON made once."""
    return count_tokens("[" + ", ".join(t.openai_json for t in tools) + "]", model) if tools else 0
