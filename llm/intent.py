"""Intent scoring for the deterministic planner: which visible tools does a message ask for?

Each tool contributes keyword *groups*: the words of its name (snake_case / camelCase split),
the words of its description, and an optional ``x-keywords`` list (in the parameter schema or
as ``Keywords: a, b`` / ``关键词：甲、乙`` in the description). A built-in bilingual synonym
table widens each word to its concept (``where`` / ``物流`` / ``到哪`` -> query, logistics).
A group that matches the message scores its weight times its rarity among the visible tools
(inverse document frequency), so a word every tool shares (``order``) decides little.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import _lru_cache_wrapper, lru_cache
from typing import Any, TypeVar

from runtime.types import ToolSpec

#: concept -> words (English words are matched by stem, others as substrings).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "query": (
        "query",
        "get",
        "check",
        "show",
        "status",
        "lookup",
        "look up",
        "view",
        "info",
        "detail",
        "where",
        "track",
        "tracking",
        "查询",
        "查一下",
        "查看",
        "查下",
        "看看",
        "状态",
        "在哪",
        "到哪",
        "进度",
        "情况",
    ),
    "logistics": (
        "logistics",
        "shipping",
        "shipment",
        "ship",
        "shipped",
        "delivery",
        "deliver",
        "where",
        "track",
        "tracking",
        "courier",
        "parcel",
        "package",
        "物流",
        "快递",
        "配送",
        "发货",
        "到哪",
        "在哪",
        "运输",
        "包裹",
    ),
    "order": ("order", "purchase", "订单", "单号"),
    "refund": ("refund", "reimburse", "money back", "退款", "退钱", "退货"),
    "cancel": ("cancel", "取消"),
    "sum": (
        "sum",
        "total",
        "add up",
        "combined",
        "altogether",
        "合计",
        "总额",
        "总计",
        "一共",
        "加起来",
        "总共",
        "求和",
    ),
    "flight": ("flight", "fly", "plane", "airline", "航班", "机票", "飞机"),
    "search": ("search", "find", "look for", "available", "搜索", "查找", "找一下", "有没有", "查一下", "搜"),
    "rebook": ("rebook", "reschedule", "change flight", "switch", "改签", "改期", "换航班", "换到"),
    "book": ("book", "reserve", "预订", "订票", "预定"),
    "weather": ("weather", "forecast", "temperature", "天气", "气温"),
    "user": ("user", "customer", "account", "用户", "客户", "账户"),
    "notify": ("notify", "send", "email", "message", "通知", "发送", "邮件"),
    "list": ("list", "all", "列出", "所有", "全部"),
    "create": ("create", "创建", "新建", "添加"),
    "delete": ("delete", "remove", "删除", "移除"),
    "update": ("update", "modify", "edit", "更新", "修改"),
    "summarize": ("summarize", "summary", "总结", "摘要", "概括"),
    "translate": ("translate", "translation", "翻译"),
    "calculate": ("calculate", "compute", "计算"),
}

_STOPWORDS_TEXT = (
    "a an the of for to and or by with in on at is are be as it its this that these those from into "
    "your you my our their given using use via when which who what will can may returns return e.g "
    "eg i me please like one two per each any not no"
)
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())

_WORD = re.compile(r"[a-z][a-z0-9']*")
_CJK = re.compile(r"[\u3400-\u9fff]")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_KEYWORDS_IN_TEXT = re.compile(r"(?:keywords?|关键词|关键字)\s*[:：]\s*([^\n。.]+)", re.IGNORECASE)
_SPLIT_KEYWORDS = re.compile(r"[,，、;；/|]+")

NAME_WEIGHT = 2.0
KEYWORD_WEIGHT = 2.0
DESCRIPTION_WEIGHT = 1.0
#: A tool is chosen when its score is at least this share of the best score.
RELATIVE_CUTOFF = 0.6
MIN_SCORE = 0.9


def has_cjk(text: str) -> bool:
    return bool(_CJK.search(text))


def stem(word: str) -> str:
    word = word.lower().removesuffix("'s").strip("'")
    for suffix, keep in (("ies", "y"), ("ses", "s"), ("s", "")):
        if len(word) > 3 and word.endswith(suffix) and not word.endswith("ss"):
            return word[: -len(suffix)] + keep
    return word


def split_name(name: str) -> list[str]:
    """``query_order`` / ``queryOrder`` / ``query-order`` -> ``["query", "order"]``."""
    spaced = _CAMEL.sub(" ", name)
    return [p.lower() for p in re.split(r"[\s_\-.]+", spaced) if p]


def english_words(text: str) -> list[str]:
    return [stem(w) for w in _WORD.findall(text.lower())]


@dataclass(frozen=True)
class Keyword:
    text: str  # a stemmed English word / phrase, or a CJK (or other) substring
    group: str
    weight: float


@dataclass
class MessageText:
    """A message prepared for matching: stems, stemmed phrase text, the raw lower-cased text."""

    raw: str

    def __post_init__(self) -> None:
        self.lower = self.raw.lower()
        self.stems = english_words(self.raw)
        self.stem_set = set(self.stems)
        self.phrase = " " + " ".join(self.stems) + " "

    def contains(self, keyword: str) -> bool:
        if not keyword:
            return False
        if keyword.isascii():
            if " " in keyword:
                return f" {keyword} " in self.phrase
            return keyword in self.stem_set
        return keyword.lower() in self.lower


_WORD_TO_CONCEPTS: dict[str, set[str]] = {}
for _concept, _words in SYNONYMS.items():
    for _w in _words:
        _key = " ".join(english_words(_w)) if _w.isascii() else _w
        _WORD_TO_CONCEPTS.setdefault(_key, set()).add(_concept)


#: What the caches below keep is bounded in entries and in size: a tool's name, description and keywords are a
#: tenant's input (a description may be megabytes), so longer inputs are worked out on each call and never kept.
_CACHED_WORD = 64
T = TypeVar("T")
CACHED_TEXT = 4096


def kept_or_fresh(cache: _lru_cache_wrapper[T], kept: bool, *args: Any) -> T:
    """``cache(*args)`` (an ``lru_cache``) when what it works out from these inputs may be kept, else the function it
    wraps, called afresh: a tenant's or user's long text is worked out on each call and never held by the process."""
    return cache(*args) if kept else cache.__wrapped__(*args)


def _normal(word: str) -> str:
    return kept_or_fresh(_normal_cached, len(word) <= _CACHED_WORD, word)


@lru_cache(maxsize=8192)
def _normal_cached(word: str) -> str:
    return " ".join(english_words(word)) if word.isascii() else word


def _expand(word: str, weight: float) -> tuple[Keyword, ...]:
    return kept_or_fresh(_expand_cached, len(word) <= _CACHED_WORD, word, weight)


@lru_cache(maxsize=8192)
def _expand_cached(word: str, weight: float) -> tuple[Keyword, ...]:
    """A word as its own group, or as every concept it belongs to (with all the concept's words)."""
    normal = _normal(word)
    if not normal:
        return ()
    concepts = _WORD_TO_CONCEPTS.get(normal)
    if not concepts:
        return (Keyword(normal, f"word:{normal}", weight),)
    found: list[Keyword] = []
    for concept in sorted(concepts):
        found.extend(Keyword(_normal(w), f"concept:{concept}", weight) for w in SYNONYMS[concept])
    return tuple(found)


def _listed_keywords(tool: ToolSpec) -> tuple[str, ...]:
    listed = tool.parameters.get("x-keywords") if isinstance(tool.parameters, dict) else None
    return tuple(str(w) for w in listed) if isinstance(listed, list) else ()


def explicit_keywords(tool: ToolSpec) -> list[str]:
    return list(_explicit(_listed_keywords(tool), tool.description or ""))


def _explicit(listed: tuple[str, ...], description: str) -> tuple[str, ...]:
    words = [w.strip() for w in listed]
    for match in _KEYWORDS_IN_TEXT.finditer(description):
        words.extend(w.strip() for w in _SPLIT_KEYWORDS.split(match.group(1)))
    return tuple(w for w in words if w)


def tool_keywords(tool: ToolSpec) -> list[Keyword]:
    """The keywords a tool is matched by: from its name, its listed keywords and its description. Worked out once per
    distinct (name, description, keywords) in a process — the planner scores every tool on every call."""
    return list(_keywords_of(*_key_of(tool)))


def _key_of(tool: ToolSpec) -> tuple[str, str, tuple[str, ...]]:
    return tool.name, tool.description or "", _listed_keywords(tool)


def _kept(name: str, description: str, listed: tuple[str, ...]) -> bool:
    """Whether what is worked out from these texts may be kept in a cache (bounded in size: see ``CACHED_TEXT``)."""
    return len(name) + len(description) + sum(len(w) for w in listed) <= CACHED_TEXT


def _keywords_of(name: str, description: str, listed: tuple[str, ...]) -> tuple[Keyword, ...]:
    return kept_or_fresh(_keywords, _kept(name, description, listed), name, description, listed)


#: A tool's keywords by group: (group, the group's weight, its words), in the order the groups first appear.
Groups = tuple[tuple[str, float, tuple[str, ...]], ...]


def tool_groups(tool: ToolSpec) -> Groups:
    """A tool's keywords grouped (a concept's words are one group, weighted by its strongest keyword): what
    :func:`score_tools` matches. Worked out once per distinct tool text in a process, like :func:`tool_keywords`."""
    key = _key_of(tool)
    return kept_or_fresh(_groups, _kept(*key), *key)


@lru_cache(maxsize=512)
def _groups(name: str, description: str, listed: tuple[str, ...]) -> Groups:
    groups: dict[str, tuple[float, list[str]]] = {}
    for kw in _keywords_of(name, description, listed):
        weight, words = groups.get(kw.group, (0.0, []))
        words.append(kw.text)
        groups[kw.group] = (max(weight, kw.weight), words)
    return tuple((group, weight, tuple(words)) for group, (weight, words) in groups.items())


@lru_cache(maxsize=512)
def _keywords(name: str, description: str, listed: tuple[str, ...]) -> tuple[Keyword, ...]:
    keywords: list[Keyword] = []
    for part in split_name(name):
        keywords.extend(_expand(part, NAME_WEIGHT))
    for word in _explicit(listed, description):
        keywords.extend(_expand(word, KEYWORD_WEIGHT))
    text = _KEYWORDS_IN_TEXT.sub(" ", description)
    for word in english_words(text):
        if word not in STOPWORDS and len(word) > 2:
            keywords.extend(_expand(word, DESCRIPTION_WEIGHT))
    # CJK words of the description that the synonym table knows (there are no spaces to split on).
    for key, concepts in _WORD_TO_CONCEPTS.items():
        if not key.isascii() and key in text:
            for concept in concepts:
                keywords.extend(Keyword(_normal(w), f"concept:{concept}", DESCRIPTION_WEIGHT) for w in SYNONYMS[concept])
    return tuple(keywords)


@dataclass(frozen=True)
class IntentScore:
    tool: ToolSpec
    score: float
    matched: tuple[str, ...]


def score_tools(text: str, tools: Iterable[ToolSpec]) -> list[IntentScore]:
    """Score every tool against ``text``; the result keeps the tools' order."""
    tools = list(tools)
    message = MessageText(text)
    groups_per_tool = [tool_groups(tool) for tool in tools]
    document_frequency: dict[str, int] = {}
    for groups in groups_per_tool:
        for group, _, _ in groups:
            document_frequency[group] = document_frequency.get(group, 0) + 1
    total = max(1, len(tools))
    scores: list[IntentScore] = []
    for tool, groups in zip(tools, groups_per_tool, strict=True):
        score = 0.0
        matched: list[str] = []
        for group, weight, words in groups:
            if any(message.contains(w) for w in words):
                score += weight * math.log(1 + total / document_frequency[group])
                matched.append(group.split(":", 1)[1])
        scores.append(IntentScore(tool, round(score, 3), tuple(matched)))
    return scores


def choose(scores: list[IntentScore], complete: dict[str, bool] | None = None) -> list[IntentScore]:
    """The tools the message asks for, best first.

    The best tool is taken if it clears a floor. Another tool joins only if it scores close to
    the best *and* matches a part of the message the tools already chosen do not (so "where is
    order X" is one logistics call, while "refund X and track its shipment" is two). Ties go to
    the tool whose arguments are all in the message (``complete``).
    """
    complete = complete or {}
    ranked = sorted(
        (s for s in scores if s.score > 0),
        key=lambda s: (-s.score, not complete.get(s.tool.name, False)),
    )
    if not ranked or ranked[0].score < MIN_SCORE:
        return []
    cutoff = max(MIN_SCORE, ranked[0].score * RELATIVE_CUTOFF)
    chosen: list[IntentScore] = []
    covered: set[str] = set()
    for candidate in ranked:
        if candidate.score < cutoff:
            break
        if chosen and not set(candidate.matched) - covered:
            continue
        chosen.append(candidate)
        covered.update(candidate.matched)
    return chosen


#: The intent concepts a supervisor's routing rule may name (``policy.supervisor.rules[].intent``).
CONCEPTS: tuple[str, ...] = tuple(SYNONYMS)


def mentions(text: str, concept: str) -> bool:
    """Does ``text`` use a word of the intent ``concept`` (English by stem, other scripts as substrings)?"""
    words = SYNONYMS.get(concept, ())
    message = MessageText(text)
    return any(message.contains(_normal(w)) for w in words)
