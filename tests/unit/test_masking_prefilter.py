"""mask_text's gates only skip substitutions that could not change the string.

``audit.masking`` runs each pattern only when the text holds what the pattern needs (its prefix, scheme, label, a
secret word, an "@", a run of eight digits). These tests compare mask_text with every substitution run
unconditionally over many strings built from the patterns' own parts, so a pattern whose gate misses a trigger fails
here.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from audit import masking
from audit.masking import mask_text

# Pieces of every kind of secret and personal datum the patterns mask, and of harmless text around them.
FRAGMENTS = [
    "sk-", "sk-proj-", "sk_live_", "sk_test_", "pk_live_", "rk_live_", "aok_", "ghp_", "gho_", "github_pat_", "xoxb-",
    "AKIA", "ASIA", "AIza", "eyJ", "Bearer ", "Basic ", "Token ", "Digest ", "Authorization: ", "proxy-authorization=",
    "password", "passwd", "pwd", "api_key", "api key", "secret", "client_secret", "token", "sig", "cvv", "session_id",
    " is ", " was ", "=", ": ", '": "', "'", "&", "密码", "口令", "验证码", "是", "为", "：",
    "@", "alice.smith", "example.com", ".", "+", "+86 ", "0086", "-", " ", "_",
    "1", "3", "8", "0", "9", "X", "1234", "5678", "13812345678", "4111", "1111", "110105", "19491231", "002X",
    "4111 1111 1111 1111", "4111.1111.1111.1111", "\n", "\r\n", "\t", "  ",
    "5555555555554444", "+14155552671", "hunter2", "s3cr3t-value", "ABCDEFGHIJKLMNOP",
    "abcdefghijklmnopqrstuvwxyz", "0123456789abcdef", "O202411280001", "order", "shipped", "refund", "the ", "订单",
]


def _strings(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 9))) for _ in range(count)]


@pytest.mark.parametrize("keep", [frozenset(), frozenset({"phone", "email", "id_number"})])
def test_the_prefilter_never_changes_what_mask_text_returns(keep: frozenset[str]) -> None:
    changed = 0
    for text in _strings(20_000, seed=14):
        unfiltered = masking._mask_patterns(text, keep)
        assert mask_text(text, keep=keep) == unfiltered, text
        changed += unfiltered != text
    assert changed > 2_000  # the corpus is full of things to mask: the comparison is not between unchanged strings


class Counting:
    """A pattern that counts its substitutions."""

    def __init__(self, pattern: Any, calls: list[str]) -> None:
        self.pattern, self.calls = pattern, calls

    def sub(self, replace: Any, text: str) -> str:
        self.calls.append(self.pattern.pattern)
        return str(self.pattern.sub(replace, text))


@pytest.fixture
def substitutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(masking, "_TOKEN_PATTERNS", [(Counting(p, calls), r) for p, r in masking._TOKEN_PATTERNS])
    for name in ("_EMAIL", "_CN_ID", "_E164", "_CARD", "_CN_MOBILE"):
        monkeypatch.setattr(masking, name, Counting(getattr(masking, name), calls))
    return calls


@pytest.mark.parametrize("text", ["tool.call", "lookup_order", "order O2024112 shipped on Monday",
                                  "refund of 1299.00 approved", "您的订单已发货", "a basketball game"])
def test_everyday_strings_skip_every_substitution(text: str, substitutions: list[str]) -> None:
    assert mask_text(text) == text
    assert substitutions == []


@pytest.mark.parametrize(("text", "runs"), [
    ("call 13812345678", 4), ("mail a@b.co", 1), ("sk-abcdefghijklmnop", 11), ("my password is hunt3r2", 11),
    ("密码：abc123", 11), ("Bearer eyJabc.def.ghi", 11), ("4111 1111 1111 1111", 4), ("paſsword=abc123", 11),
])
def test_a_string_with_a_trigger_goes_through_the_patterns_that_need_it(text: str, runs: int,
                                                                       substitutions: list[str]) -> None:
    assert mask_text(text) != text
    assert len(substitutions) == runs, substitutions
