"""Masking of sensitive values for audit rows, previews and logs, and a prompt-injection detector.

- :func:`mask_value` masks the values of sensitive fields (declared per tool, plus a fixed list
  such as ``password``/``token``/``api_key``) anywhere in a nested structure, and masks
  sensitive patterns inside the remaining strings.
- :func:`mask_text` masks patterns in free text: phone numbers, CN ID card numbers, payment card
  numbers (Luhn-checked), API keys and tokens, ``key=value`` secrets and e-mail addresses. Some
  shape is kept for operators (``138****5678``, last 4 digits of a card). Field names are masked
  only where they label a value (``password: x``, ``"token": "x"``, ``api_key=x``,
  ``Authorization: Bearer x``, ``密码：x``) or when the word after them looks like a credential
  (``my password is hunter2``, ``Bearer eyJ…``), never in prose ("my token expired yesterday").
  ``keep`` leaves the :data:`OPTIONAL_PATTERNS` it names raw (an agent version's opt-in for run
  input); payment cards, passwords, tokens and keys are always masked.
- :func:`summarize_arguments` is the compact, masked argument summary of an audit row.
- :func:`detect_injection` flags known prompt-injection phrasings (English and Chinese).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Any

__all__ = [
    "ALWAYS_SENSITIVE",
    "MASK",
    "OPTIONAL_PATTERNS",
    "InjectionMatch",
    "detect_injection",
    "is_sensitive_key",
    "luhn_valid",
    "mask_text",
    "mask_value",
    "normalize_key",
    "summarize_arguments",
]

MASK = "******"

#: Personal-data patterns an agent version may keep raw in its run input (policy ``input_masking.raw``).
#: Payment card numbers, passwords, tokens and API keys are not optional: they are always masked.
OPTIONAL_PATTERNS = frozenset({"email", "id_number", "phone"})

#: Field names (normalised) whose values are always masked, whatever the tool declares.
ALWAYS_SENSITIVE = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "clientsecret",
        "token",
        "accesstoken",
        "refreshtoken",
        "idtoken",
        "authtoken",
        "sessiontoken",
        "apikey",
        "xapikey",
        "apitoken",
        "authorization",
        "proxyauthorization",
        "auth",
        "cookie",
        "setcookie",
        "sessionid",
        "csrftoken",
        "privatekey",
        "secretkey",
        "accesskey",
        "signingkey",
        "cardnumber",
        "cardno",
        "creditcard",
        "creditcardnumber",
        "pan",
        "cvv",
        "cvc",
        "cvv2",
        "pin",
        "otp",
        "securitycode",
    }
)
_CARD_KEYS = frozenset({"cardnumber", "cardno", "creditcard", "creditcardnumber", "pan"})
#: Substrings that make a field sensitive wherever they appear in its (normalised) name.
_SENSITIVE_PARTS = ("password", "passwd", "secret", "apikey", "privatekey", "creditcard", "cardnumber")
#: Suffixes that make a field sensitive (``github_token``, ``session_cookie``; not ``max_tokens``).
_SENSITIVE_SUFFIXES = ("token", "cookie", "authorization", "accesskey", "secretkey")


_KEY_SEPARATORS = re.compile(r"[\s_\-.]+")


def normalize_key(key: object) -> str:
    if type(key) is str and len(key) <= 128:  # field names repeat in every payload: remembered (names, never values)
        return _normalized(key)
    return _KEY_SEPARATORS.sub("", str(key)).lower()


@lru_cache(maxsize=4096)
def _normalized(key: str) -> str:
    return _KEY_SEPARATORS.sub("", key).lower()


def is_sensitive_key(key: object, sensitive_fields: Iterable[str] = ()) -> bool:
    norm = normalize_key(key)
    if sensitive_fields and norm in {normalize_key(f) for f in sensitive_fields}:
        return True
    return _sensitive_name(norm)


@lru_cache(maxsize=4096)
def _sensitive_name(norm: str) -> bool:
    if norm in ALWAYS_SENSITIVE:
        return True
    return any(part in norm for part in _SENSITIVE_PARTS) or norm.endswith(_SENSITIVE_SUFFIXES)


# --------------------------------------------------------------------------- free text


def luhn_valid(digits: str) -> bool:
    if not digits.isdigit():
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _keep_last(text: str, keep: int = 4) -> str:
    """Replace every digit except the last ``keep`` with ``*``, keeping separators."""
    total = sum(ch.isdigit() for ch in text)
    out, seen = [], 0
    for ch in text:
        if ch.isdigit():
            seen += 1
            out.append(ch if seen > total - keep else "*")
        else:
            out.append(ch)
    return "".join(out)


def _mask_token(token: str, prefix_len: int) -> str:
    prefix = token[:prefix_len]
    tail = token[-4:] if len(token) - prefix_len >= 16 else ""
    return f"{prefix}****{tail}"


_SECRET_KEY_WORDS = (
    r"(?:api[_\-\s]?key|access[_\-]?key|secret[_\-]?key|client[_\-]?secret|secret|passw(?:or)?d|pwd|passcode|"
    r"access[_\-]?token|refresh[_\-]?token|auth[_\-]?token|token|signature|sig|private[_\-]?key|session[_\-]?id|cvv2?|cvc)"
)


def _looks_like_credential(value: str) -> bool:
    """A word after ``Bearer``/``password is`` that is a credential, not English: it has a digit or a
    symbol, mixes case inside the word, ends in base64 padding, or is long."""
    if len(value) < 3:
        return False
    inner = value[1:]
    return (
        any(ch.isdigit() for ch in value)
        or any(not ch.isalnum() and ch not in "-'." for ch in value)
        or (any(ch.isupper() for ch in inner) and any(ch.islower() for ch in value))
        or len(value) >= 24
    )


_TOKEN_PATTERNS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    # An Authorization header in text: whatever its scheme, the credential is masked.
    (
        re.compile(
            r"(?i)\b((?:proxy[_\-]?)?authorization[\"']?\s*[:=]\s*[\"']?(?:(?:Bearer|Basic|Token|Digest)\s+)?)"
            r"(?!\*{4}|(?:Bearer|Basic|Token|Digest)\s+\*{4})([^\s\"',;}\])]+)"
        ),
        lambda m: f"{m.group(1)}{MASK}",
    ),
    # Authorization schemes in text: "Bearer eyJ...", "Basic dXNlcjpwYXNz", "Token abc123" - but not the
    # words of a sentence ("my token expired", "a basic question"): the value must look like a credential.
    (
        re.compile(r"\b(Bearer|Basic|Token|Digest)(\s+)([A-Za-z0-9\-._~+/]{6,}=*)", re.I),
        lambda m: f"{m.group(1)}{m.group(2)}{MASK}" if _looks_like_credential(m.group(3)) else m.group(0),
    ),
    # JSON Web Tokens
    (
        re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
        lambda m: "eyJ****",
    ),
    # Vendor keys: OpenAI/Anthropic-style sk-..., our aok_..., GitHub, Slack, AWS, Google
    (
        re.compile(
            r"(?<![A-Za-z0-9])(sk-(?:proj-|ant-|live-|test-)?|aok_|rk_live_|sk_live_|sk_test_|pk_live_)"
            r"[A-Za-z0-9_\-]{12,}"
        ),
        lambda m: _mask_token(m.group(0), len(m.group(1))),
    ),
    (
        re.compile(r"(?<![A-Za-z0-9])(ghp_|gho_|ghu_|ghs_|ghr_|github_pat_)[A-Za-z0-9_]{20,}"),
        lambda m: _mask_token(m.group(0), len(m.group(1))),
    ),
    (re.compile(r"(?<![A-Za-z0-9])(xox[abposr]-)[A-Za-z0-9\-]{10,}"), lambda m: _mask_token(m.group(0), 5)),
    (re.compile(r"(?<![A-Z0-9])(AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"), lambda m: _mask_token(m.group(0), 4)),
    (re.compile(r"(?<![A-Za-z0-9])AIza[A-Za-z0-9_\-]{35}"), lambda m: _mask_token(m.group(0), 4)),
    # key=value / "key": "value" / key: value secrets (any length after a secret-looking key)
    (
        re.compile(
            rf"""(?ix)
            (?P<key>["']?\b[\w\-]*?{_SECRET_KEY_WORDS}\b["']?\s*[:=]\s*["']?)
            (?P<value>(?!\*{{4}})[^\s"'&,;}}\])]{{3,}})
            """
        ),
        lambda m: f"{m.group('key')}{MASK}",
    ),
    # "my password is hunter2": a secret word, "is"/"was", then something that looks like a credential
    (
        re.compile(rf"(?i)(\b{_SECRET_KEY_WORDS}\s+(?:is|was)\s+[\"']?)(?!\*{{4}})([^\s\"'&,;}}\])]{{3,}})"),
        lambda m: f"{m.group(1)}{MASK}" if _looks_like_credential(m.group(2).rstrip(".!?")) else m.group(0),
    ),
    # Chinese: 密码：hunter2, 密码是 hunter2, 支付密码为123456 (the value is the ASCII run after the label)
    (
        re.compile(r"((?:密码|口令|密钥|秘钥|令牌|验证码|安全码|私钥)\s*(?:是|为|[:：=])\s*)(?!\*{4})([!-~]{3,})"),
        lambda m: f"{m.group(1)}{MASK}",
    ),
]

_EMAIL = re.compile(r"(?<![\w.+-])([A-Za-z0-9._%+-]+)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})")
_CN_ID = re.compile(
    r"(?<![0-9A-Za-z])([1-9]\d{5})((?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01]))(\d{3})([0-9Xx])(?![0-9A-Za-z])"
)
_E164 = re.compile(r"(?<![\w+])\+[1-9](?:[ \-]?\d){7,14}(?![\d])")
#: What may stand between a card's digits: up to three spaces, tabs, dots or hyphens, and at most one line break (with
#: an indent of up to two). One class, then the line break, then the next digit, none overlapping: a run of digits and
#: separators is matched in one pass, whatever its length, never by trying ways to split it.
_CARD_SEP = r"[ \t.\-]{0,3}(?:\r?\n[ \t]{0,2})?"
#: A run of digit groups (the whole run: :func:`_mask_card` finds the card inside it).
_CARD = re.compile(rf"(?<![\d*])\d(?:{_CARD_SEP}\d)*")
# Not inside a word of letters and digits (a hex id such as a call id "fl:0a14415484721b...": its digit runs are no
# phone number; a UUID with its hyphens is kept whole by _UUID already).
_CN_MOBILE = re.compile(r"(?<![\dA-Za-z*])(?:(?:\+|00)?86[ \-]?)?(1[3-9]\d)[ \-]?(\d{4})[ \-]?(\d{4})(?![\dA-Za-z*])")


def _mask_email(m: re.Match[str]) -> str:
    local = m.group(1)
    return f"{local[:1]}***@{m.group(2)}"


def _mask_cn_id(m: re.Match[str]) -> str:
    return f"{m.group(1)}{'*' * 8}{m.group(3)}{m.group(4)}"


def _mask_e164(m: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", m.group(0))
    n = len(digits)
    head = digits[: max(1, n - 8)]
    stars = n - len(head) - 4
    return f"+{head}{'*' * stars}{digits[-4:]}"


_GROUP = re.compile(r"\d+")
_GROUPS = re.compile(r"(\d+)")  # split keeping the groups


def _mask_card(m: re.Match[str]) -> str:
    """A run of digit groups with the card numbers in it masked: the whole run, or any groups in a row (of three digits
    or more) that make 13 to 19 digits and pass Luhn (a card after another number: ``qty 2\n4111 1111 1111 1111``),
    all but each one's last 4 digits. Digits of a mask already (``1111****``) are left as they are."""
    text = m.group(0)
    if len(text) < 13 or (m.end() < len(m.string) and m.string[m.end()] == "*"):
        return text
    groups = _GROUP.findall(text)
    digits = groups[0] if len(groups) == 1 else "".join(groups)
    if len(digits) < 13:
        return text
    if len(digits) <= 19 and luhn_valid(digits):
        return _keep_last(text, 4)
    if len(groups) == 1:
        return text  # one long number (an id): no card inside it
    hidden = _cards_inside(digits, [len(g) for g in groups])
    if not hidden:
        return text
    out, seen = [], 0
    for piece in _GROUPS.split(text):  # separators and groups in turn, a separator first
        if piece and piece[0].isdigit():
            out.append("".join("*" if seen + k in hidden else ch for k, ch in enumerate(piece)))
            seen += len(piece)
        else:
            out.append(piece)
    return "".join(out)


#: Luhn's doubling of a digit (summing the two digits of the product).
_DOUBLE = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)
#: The shortest group of digits a card is written in (4-4-4-4, 4-6-5, 4-6-4): a table of short numbers holds no card.
_CARD_GROUP = 3


def _cards_inside(digits: str, sizes: list[int]) -> set[int]:
    """The indexes of ``digits`` to hide: every window of whole groups (``sizes``, each of at least three digits) that
    holds 13 to 19 digits and passes Luhn, but its last 4. Linear in the digits: Luhn sums from prefix sums by parity
    (built at C speed), at most seven windows from each group."""
    values = list(map(int, digits))
    doubles = [_DOUBLE[v] for v in values]
    plain = (_by_parity(values, 0), _by_parity(values, 1))
    doubled = (_by_parity(doubles, 0), _by_parity(doubles, 1))
    bounds = list(accumulate(sizes, initial=0))
    hidden: set[int] = set()
    for first in range(len(sizes)):
        a = bounds[first]
        for last in range(first + 1, len(bounds)):
            b = bounds[last]
            if sizes[last - 1] < _CARD_GROUP or b - a > 19:
                break
            q = (b - 1) % 2  # digits of the last one's parity count as they are, the others doubled
            if b - a >= 13 and (plain[q][b] - plain[q][a] + doubled[1 - q][b] - doubled[1 - q][a]) % 10 == 0:
                hidden.update(range(a, b - 4))
    return hidden


def _by_parity(values: list[int], parity: int) -> list[int]:
    """Prefix sums of ``values`` at the indexes of ``parity`` (the others count 0): ``out[k]`` sums those below k."""
    kept = values[:]
    kept[1 - parity :: 2] = [0] * len(kept[1 - parity :: 2])
    return list(accumulate(kept, initial=0))


def _keep_set(keep: Iterable[str]) -> frozenset[str]:
    kept = frozenset(keep)
    unknown = kept - OPTIONAL_PATTERNS
    if unknown:
        raise ValueError(f"only {sorted(OPTIONAL_PATTERNS)} can be kept raw; {sorted(unknown)} are always masked")
    return kept


# What the patterns need somewhere in the text before one can match. Every pattern of _TOKEN_PATTERNS needs one of
# _TOKEN_HINTS (its scheme, prefix or label, or a secret word), compared with the text lower-cased so case-sensitive
# patterns are covered too; the e-mail pattern needs an "@"; every phone, ID and card pattern contains eight digits in
# a row with at most a card's separators between them (_CARD_SEP; the others allow single spaces or hyphens). Most
# strings (words, ids, prose, amounts) have none of these and skip the substitutions that could not change them: the
# key=value pattern alone costs about 20 us on an 85-character sentence. A substitution only ever replaces what it
# matched with stars (keeping a prefix or the last digits), so it never creates a trigger for a later pattern.
# tests/unit/test_masking_prefilter.py checks that the result is the same with and without the gates.
_TOKEN_HINTS = re.compile("|".join(re.escape(word) for word in (
    "authorization", "bearer", "basic", "token", "digest", "eyj", "sk-", "sk_", "aok_", "rk_live_", "pk_live_",
    "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox", "akia", "asia", "aiza",
    "key", "secret", "pass", "pwd", "sig", "session", "cvv", "cvc",  # every word of _SECRET_KEY_WORDS holds one
    "密码", "口令", "密钥", "秘钥", "令牌", "验证码", "安全码", "私钥",
)))
# Letters that IGNORECASE matches to an ASCII letter but lower() does not turn into it.
_FOLD = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})
_DIGIT_RUN = re.compile(rf"\d(?:{_CARD_SEP}\d){{7}}")


def mask_text(text: str, *, keep: Iterable[str] = ()) -> str:
    """Mask secrets and personal data inside free text (idempotent); ``keep`` names optional patterns left raw."""
    if not text or not isinstance(text, str):
        return text
    return _mask_patterns(text, _keep_set(keep), gated=True)


def _mask_patterns(text: str, kept: frozenset[str], *, gated: bool = False) -> str:
    if not gated or _TOKEN_HINTS.search((text if text.isascii() else text.translate(_FOLD)).lower()):
        for pattern, replace in _TOKEN_PATTERNS:
            text = pattern.sub(replace, text)
    if "email" not in kept and (not gated or "@" in text):
        text = _EMAIL.sub(_mask_email, text)
    if gated and _DIGIT_RUN.search(text) is None:
        return text
    if "-" not in text:
        return _mask_numbers(text, kept)
    # an id's digits are not a card, a phone or an ID number: split keeps the ids at the odd places, unmasked
    return "".join(piece if i % 2 else _mask_numbers(piece, kept) for i, piece in enumerate(_UUID.split(text)))


#: A UUID (a run's, an approval's id): its hex groups can hold digit runs that look like a card or a phone number.
_UUID = re.compile(r"(?<![0-9A-Za-z-])([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
                   r"(?![0-9A-Za-z-])")


def _mask_numbers(text: str, kept: frozenset[str]) -> str:
    if "id_number" not in kept:
        text = _CN_ID.sub(_mask_cn_id, text)
    if "phone" not in kept:
        text = _E164.sub(_mask_e164, text)
    text = _CARD.sub(_mask_card, text)
    if "phone" not in kept:
        text = _CN_MOBILE.sub(lambda m: f"{m.group(1)}****{m.group(3)}", text)
    return text


# --------------------------------------------------------------------------- structures


def _shape_mask(value: Any) -> str:
    """Mask a declared-sensitive value; phone, card, ID and e-mail values keep an operator-friendly shape."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return MASK
    text = str(value).strip()
    for pattern, replace in (
        (_CN_ID, _mask_cn_id),
        (_CN_MOBILE, lambda m: f"{m.group(1)}****{m.group(3)}"),
        (_E164, _mask_e164),
        (_EMAIL, _mask_email),
    ):
        if pattern.fullmatch(text):
            return pattern.sub(replace, text)
    card = _CARD.fullmatch(text)
    if card is not None and 13 <= sum(ch.isdigit() for ch in text) <= 19:  # one card, not a card among other digits
        masked = _mask_card(card)
        if masked != text:
            return masked
    return MASK


def mask_value(
    obj: Any,
    sensitive_fields: Iterable[str] = (),
    *,
    mask_strings: bool = True,
    keep: Iterable[str] = (),
) -> Any:
    """A masked deep copy of ``obj``.

    Values under sensitive keys (declared ``sensitive_fields`` compared case/underscore-
    insensitively, plus :data:`ALWAYS_SENSITIVE`) are replaced; other strings go through
    :func:`mask_text` (with ``keep``) when ``mask_strings`` is true.
    """
    declared = frozenset(normalize_key(f) for f in sensitive_fields) if sensitive_fields else _NOTHING
    return _mask(obj, declared, mask_strings, _keep_set(keep) if keep else _NOTHING)


_NOTHING: frozenset[str] = frozenset()
#: Short strings found to need no masking with nothing kept raw (so with anything kept raw too): "planning",
#: "next step", a hook's name. Every step's events repeat them; a set lookup instead of the patterns' prefilter.
#: Only strings the patterns left as they were are remembered, never one they masked; cleared when full.
_CLEAN: set[str] = set()
_CLEAN_LONGEST, _CLEAN_MOST = 64, 4096


def _mask_string(text: str, keep: frozenset[str]) -> str:
    if text in _CLEAN:
        return text
    masked = _mask_patterns(text, keep, gated=True)
    if not keep and masked == text and len(text) <= _CLEAN_LONGEST:
        if len(_CLEAN) >= _CLEAN_MOST:
            _CLEAN.clear()
        _CLEAN.add(text)
    return masked


_KEY_PLAIN, _KEY_CARD, _KEY_SECRET = "plain", "card", "secret"
#: A field name's normalised form and class (plain, card, secret), remembered by name (names, never values).
_KEYS: dict[str, tuple[str, str]] = {}


def _key_kind(key: object) -> tuple[str, str]:
    norm = normalize_key(key)
    known = (norm, _KEY_CARD if norm in _CARD_KEYS else _KEY_SECRET if _sensitive_name(norm) else _KEY_PLAIN)
    if type(key) is str and len(key) <= 128:
        if len(_KEYS) >= 4096:
            _KEYS.clear()
        _KEYS[key] = known
    return known


def _mask(obj: Any, declared: frozenset[str], mask_strings: bool, keep: frozenset[str] = _NOTHING) -> Any:
    # Every event payload of every step comes through here: the common types are told apart by ``type()`` first (an
    # ABC ``isinstance`` costs more than the rest of a small payload's walk), a key's class is remembered by name.
    kind = type(obj)
    if kind is str:
        return _mask_string(obj, keep) if mask_strings and obj else obj
    if kind is int or kind is float or kind is bool or obj is None:
        return obj
    if isinstance(obj, list | tuple):
        items = [_mask(v, declared, mask_strings, keep) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    if kind is dict or isinstance(obj, Mapping):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            if value is None or value == "":
                out[key] = value
                continue
            known = _KEYS.get(key) if type(key) is str else None
            if known is None:
                known = _key_kind(key)
            norm, kind_of_key = known
            if kind_of_key is _KEY_CARD:
                out[key] = _shape_mask(value)
            elif kind_of_key is _KEY_SECRET:
                out[key] = MASK
            elif norm in declared:
                out[key] = _shape_mask(value)
            else:
                out[key] = _mask(value, declared, mask_strings, keep)
        return out
    if isinstance(obj, str) and mask_strings:
        return mask_text(obj, keep=keep)
    return obj


def summarize_arguments(
    args: Any,
    sensitive_fields: Iterable[str] = (),
    max_len: int = 500,
    *,
    max_string: int = 120,
) -> str:
    """Masked, compact one-line JSON of ``args`` for an audit row (long strings shortened)."""
    masked = mask_value(args, sensitive_fields)

    def shorten(value: Any) -> Any:
        if isinstance(value, str) and len(value) > max_string:
            return value[:max_string] + f"…(+{len(value) - max_string} chars)"
        if isinstance(value, dict):
            return {k: shorten(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [shorten(v) for v in value]
        return value

    text = json.dumps(shorten(masked), ensure_ascii=False, separators=(",", ":"), default=str)
    if len(text) > max_len:
        suffix = f"…(+{len(text) - max_len} chars)"
        text = text[: max(0, max_len - len(suffix))] + suffix
    return text


# --------------------------------------------------------------------------- prompt injection


@dataclass(frozen=True)
class InjectionMatch:
    label: str
    text: str
    start: int
    end: int


_ZH = r"[\u4e00-\u9fff]"
_INJECTION_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        "ignore_instructions",
        re.compile(
            r"\b(?:ignore|disregard|forget|override|bypass|skip)\b[\s\w,'-]{0,40}?"
            r"\b(?:previous|prior|above|earlier|preceding|all|any|your|the|system|developer|original)\b"
            r"[\s\w,'-]{0,30}?\b(?:instructions?|prompts?|rules|directions|guidelines|directives|context|constraints)\b",
            re.I,
        ),
    ),
    (
        "ignore_instructions",
        re.compile(
            r"(?:忽略|无视|忘记|忘掉|不要理会|不用理会|跳过|抛开|放弃)(?:掉)?(?:你)?(?:之前|以前|先前|上面|上述|前面|以上|此前|所有|全部|一切)?"
            r"(?:的)?(?:所有|全部|一切)?(?:的)?(?:指令|指示|提示词?|规则|命令|要求|设定|约束|限制)"
        ),
    ),
    (
        "reveal_system_prompt",
        re.compile(
            r"\b(?:reveal|show|print|display|output|repeat|tell|give|leak|dump|share|disclose)\b[\s\w,'-]{0,30}?"
            r"\b(?:system|hidden|initial|original|secret|developer)\s+(?:prompt|instructions?|message)s?\b",
            re.I,
        ),
    ),
    (
        "reveal_system_prompt",
        re.compile(
            r"(?:泄露|显示|输出|打印|告诉我|给我|透露|重复|展示|说出)" + _ZH + r"{0,10}?"
            r"(?:系统提示词?|系统指令|系统消息|初始指令|隐藏指令|原始指令|system prompt)",
            re.I,
        ),
    ),
    (
        "role_jailbreak",
        re.compile(
            r"\byou\s+are\s+now\s+(?:DAN|an?\s+(?:unrestricted|unfiltered|uncensored|jailbroken)|"
            r"in\s+(?:developer|god|jailbreak)\s+mode|free\s+of)\b|\bDAN\s+mode\b|\bdo\s+anything\s+now\b|"
            r"\b(?:developer|god|jailbreak)\s+mode\s+(?:enabled|on|activated)\b|\bjailbreak(?:ing)?\s+(?:the|this)\b",
            re.I,
        ),
    ),
    (
        "role_jailbreak",
        re.compile(
            r"你现在是(?:一个)?(?:没有|不受|不再受)(?:任何)?(?:限制|约束|审查)|(?:进入|开启|启用|切换到)(?:开发者|越狱|上帝|DAN)模式"
        ),
    ),
    (
        "role_override_marker",
        re.compile(
            r"(?im)^\s*#{2,}\s*(?:system|assistant|instructions?|developer)\b|<\|\s*(?:im_start|im_end|system|"
            r"endoftext)\s*\|>|\[/?(?:INST|SYS)\]|<</?SYS>>|^\s*(?:system|developer)\s*:\s*\S|</?system>"
        ),
    ),
    (
        "new_instructions",
        re.compile(
            r"\b(?:new|updated|real|actual|additional)\s+(?:system\s+)?instructions?\s*:|\bfrom\s+now\s+on\b,?\s+"
            r"you\s+(?:will|must|are|shall|should)\b",
            re.I,
        ),
    ),
    ("new_instructions", re.compile(r"(?:从现在开始|从现在起|接下来)[,，]?\s*你(?:必须|要|将|只能|是)|新的指令[:：]")),
    (
        "exfiltration",
        re.compile(
            r"\b(?:send|post|upload|forward|email|exfiltrate|transmit)\b[\s\w,'-]{0,40}?"
            r"\b(?:api\s*keys?|passwords?|credentials|secrets?|tokens?|conversation\s+history)\b[\s\w,'-]{0,30}?"
            r"\b(?:to|at)\b\s+\S+",
            re.I,
        ),
    ),
    (
        "exfiltration",
        re.compile(r"(?:发送|上传|转发|发给|发到)" + _ZH + r"{0,10}?(?:密码|密钥|令牌|凭证|token|api\s*key)", re.I),
    ),
    (
        "exfiltration",
        re.compile(
            r"(?:把|将)"
            + _ZH
            + r"{0,10}?(?:密码|密钥|令牌|凭证|token|api\s*key)"
            + _ZH
            + r"{0,6}?(?:发送|上传|转发|发给|发到)",
            re.I,
        ),
    ),
]


def detect_injection(text: str) -> list[InjectionMatch]:
    """Known prompt-injection phrasings in ``text``, ordered by position (overlaps of one label merged)."""
    if not text:
        return []
    found: list[InjectionMatch] = []
    for label, pattern in _INJECTION_PATTERNS:
        for m in pattern.finditer(text):
            if any(f.label == label and f.start < m.end() and m.start() < f.end for f in found):
                continue
            found.append(InjectionMatch(label=label, text=m.group(0)[:200], start=m.start(), end=m.end()))
    return sorted(found, key=lambda f: (f.start, f.label))
