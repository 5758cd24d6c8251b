"""Tenants' regular expressions, matched with a time bound.

Tenants write patterns in several places: JSON Schema ``pattern`` and ``patternProperties`` (tool argument schemas,
a flow's ``input_schema``, a plugin's settings schema), a supervisor's routing rules and the context policy's
identifier patterns. Python's ``re`` backtracks without limit, so one pattern such as ``(a|aa)+$`` against forty
characters holds a server or worker thread for minutes. Every match of such a pattern goes through here instead: it
runs on the ``regex`` engine (the same syntax as ``re``) with a timeout per match, and a whole check (a validation,
a routing decision) shares one budget (``budget()``). Past either, ``PatternError`` (a ``CheckError``) says which
pattern and why; callers turn it into a problem for the caller, the model or the trace, never a hung thread or a 500.
Compiling is bounded too: ``regex`` writes counted repeats out, so ``(a{10000}){10000}`` would take all the memory
there is; a pattern is first parsed by ``re`` (which writes nothing out) and refused past ``MAX_WEIGHT`` elements.

jsonschema's keywords call ``re.search``; this module points the two jsonschema modules that do (``_keywords`` and
``_utils``, pinned version) at the bounded search when it is imported (``runtime/schemas.py`` applies tenant schemas).
``tests/unit/runtime/test_patterns.py`` fails if jsonschema stops using it.
"""

from __future__ import annotations

import re
import re._constants as _c
import re._parser as _parser
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

import jsonschema._keywords
import jsonschema._utils
import regex

#: The longest one match may take.
MATCH_SECONDS = 0.05
#: What a pass (one validation, one routing decision) may spend on all its matches together.
BUDGET_SECONDS = 0.25
#: Patterns longer than this are compiled on each use and never kept (a pattern is tenant input).
MAX_CACHED_CHARS = 1000
#: The most elements a pattern may stand for with its counted repeats written out (about 1 KB each compiled).
MAX_WEIGHT = 1000

#: The enclosing budget's end on its thread's CPU clock, with that thread's id: a context copied to another thread
#: (asgiref, executors) carries no budget there, as that thread's clock is another (its matches keep their own bound).
_deadline: ContextVar[tuple[int, float] | None] = ContextVar("pattern_deadline", default=None)


def _budget_end() -> float | None:
    entry = _deadline.get()
    return entry[1] if entry is not None and entry[0] == threading.get_ident() else None


class CheckError(ValueError):
    """A check by a tenant's pattern or schema that could not be made: it does not compile, or it took too long."""


class PatternError(CheckError):
    """A pattern that could not be matched: it does not compile, or it took too long (it backtracks)."""

    def __init__(self, pattern: str, reason: str) -> None:
        self.pattern, self.reason = pattern, reason
        shown = pattern if len(pattern) <= 80 else f"{pattern[:80]}…"
        super().__init__(f"the pattern {shown!r} {reason}")


def _slow(pattern: str) -> PatternError:
    return PatternError(pattern, f"took longer than {MATCH_SECONDS * 1000:g} ms to match (or the check's "
                                 f"{BUDGET_SECONDS * 1000:g} ms for all its patterns ran out): it backtracks, as "
                                 "nested or overlapping repeats such as (a+)+ or (a|aa)+ do, and must be simplified")


@contextmanager
def budget(seconds: float = BUDGET_SECONDS) -> Iterator[None]:
    """Every match inside shares ``seconds`` of this thread's CPU time (an enclosing budget that ends sooner still
    applies). CPU time, not the wall clock: what the budget stops is a pattern or schema that computes for too long,
    and a busy machine that deschedules the thread, or another thread holding the GIL, spends none of it (on a loaded
    2-core machine a plain schema check failed past 250 ms of wall clock)."""
    deadline = time.thread_time() + seconds
    outer = _budget_end()
    token = _deadline.set((threading.get_ident(), deadline if outer is None else min(outer, deadline)))
    try:
        yield
    finally:
        _deadline.reset(token)


def spent() -> bool:
    """Whether the enclosing ``budget()`` has run out (False outside any)."""
    deadline = _budget_end()
    return deadline is not None and time.thread_time() > deadline


def _timeout(pattern: str) -> float:
    deadline = _budget_end()
    if deadline is None:
        return MATCH_SECONDS
    left = deadline - time.thread_time()  # CPU seconds left, given to the match as its wall-clock bound: no looser
    if left <= 0:
        raise _slow(pattern)
    return min(MATCH_SECONDS, left)


class _TooLarge(ValueError):
    pass


def _weight(items: Any, limit: int = 0) -> int:
    """How many pattern elements ``items`` (``re``'s parse) stand for once counted repeats are written out, as the
    ``regex`` engine does when it compiles them (stops counting past the bound)."""
    total = 0
    for op, av in items:
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            low, high, inner = av
            total += max(low, 1 if high == _c.MAXREPEAT else high) * _weight(inner, limit)
        elif op is _c.SUBPATTERN:
            total += _weight(av[3], limit)
        elif op is _c.ATOMIC_GROUP:
            total += _weight(av, limit)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            total += _weight(av[1], limit)
        elif op is _c.BRANCH:
            total += sum(_weight(branch, limit) for branch in av[1])
        elif op is _c.GROUPREF_EXISTS:
            total += _weight(av[1], limit) + (_weight(av[2], limit) if av[2] else 0)
        else:
            total += 1
        if total > max(MAX_WEIGHT, limit):
            return total
    return total


def _compile(pattern: str, flags: int = 0) -> Any:
    """Checked with ``re``'s parser first (it writes nothing out): the ``regex`` engine expands counted repeats when it
    compiles, so ``(a{10000}){10000}`` would take all the memory there is."""
    weight = _weight(_parser.parse(pattern, flags), len(pattern))
    if weight > max(MAX_WEIGHT, len(pattern)):  # what the pattern spells out itself is paid for by its length
        raise _TooLarge(f"is too large a regular expression: its counted repeats multiply out to more than {MAX_WEIGHT} "
                        "elements; nest fewer or smaller {n} repeats (a length limit is maxLength's job, not a pattern's)")
    return _cached(pattern, flags) if len(pattern) <= MAX_CACHED_CHARS else regex.compile(pattern, flags)


@lru_cache(maxsize=256)
def _cached(pattern: str, flags: int) -> Any:
    return regex.compile(pattern, flags)


def compiled(pattern: str, flags: int = 0) -> Any:
    """``pattern`` compiled by the ``regex`` engine; ``PatternError`` if it does not compile."""
    try:
        return _compile(pattern, flags)
    except _TooLarge as exc:
        raise PatternError(pattern, str(exc)) from None
    except (regex.error, re.error, ValueError, OverflowError, RecursionError) as exc:
        raise PatternError(pattern, f"is not a valid regular expression ({exc})") from None


def compile_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be used, for checks at save (``is not a valid regular expression (...), got '('``), or
    None."""
    try:
        compiled(pattern)
    except PatternError as exc:
        return f"{exc.reason}, got {pattern[:80]!r}"
    return None


def search(pattern: str, text: str, flags: int = 0) -> Any:
    """``re.search`` within the time bound; ``PatternError`` past it."""
    try:
        return compiled(pattern, flags).search(text, timeout=_timeout(pattern))
    except TimeoutError:
        raise _slow(pattern) from None


def findall(pattern: str, text: str, flags: int = 0) -> list[Any]:
    """``re.findall`` within the time bound; ``PatternError`` past it."""
    try:
        return list(compiled(pattern, flags).findall(text, timeout=_timeout(pattern)))
    except TimeoutError:
        raise _slow(pattern) from None


class _BoundedRe:
    """What jsonschema's keyword modules use of ``re``: ``search``, bounded."""

    error = regex.error

    @staticmethod
    def search(pattern: str, string: str, flags: int = 0) -> Any:
        return search(pattern, string, flags)


def guard_jsonschema() -> None:
    """Point jsonschema's pattern keywords at the bounded search (done on import; again if something undid it)."""
    jsonschema._keywords.re = _BoundedRe
    jsonschema._utils.re = _BoundedRe


def jsonschema_guarded() -> bool:
    """Whether jsonschema's pattern keywords go through the bounded search (checked by the tests)."""
    return jsonschema._keywords.re is _BoundedRe and jsonschema._utils.re is _BoundedRe


guard_jsonschema()
