"""mask_value remembers short strings that need no masking (audit/masking.py ``_CLEAN``), and field names' classes.

What is remembered must never change a result: a string is remembered only when masking left it as it was with
nothing kept raw, so a later call with or without ``keep`` returns what a fresh walk would.
"""

from __future__ import annotations

import pytest

from audit import masking
from audit.masking import mask_value
from tests.unit.test_masking_prefilter import _strings


@pytest.fixture(autouse=True)
def empty_memo() -> None:
    masking._CLEAN.clear()
    masking._KEYS.clear()


def _fresh(obj: object, keep: frozenset[str] = frozenset()) -> object:
    masking._CLEAN.clear()
    masking._KEYS.clear()
    return mask_value(obj, keep=keep)


def test_a_string_that_was_masked_is_never_remembered() -> None:
    secret = "token=abcdef0123456789"
    phone = "13812345678"
    assert mask_value({"note": secret, "who": phone}) != {"note": secret, "who": phone}
    assert secret not in masking._CLEAN and phone not in masking._CLEAN
    assert mask_value({"note": secret})["note"] != secret  # masked again, not served from memory


def test_a_string_kept_raw_is_not_remembered_as_clean_for_callers_that_keep_nothing() -> None:
    email = "alice@example.com"
    assert mask_value({"to": email}, keep=["email"]) == {"to": email}  # kept raw for this caller
    assert email not in masking._CLEAN
    assert mask_value({"to": email}) != {"to": email}  # still masked for everyone else


def test_remembered_results_equal_fresh_ones_over_many_strings() -> None:
    texts = _strings(3000, seed=6)
    for keep in (frozenset(), frozenset({"phone", "email", "id_number"})):
        for text in texts:
            warm = mask_value({"field": text, "api_key": text}, keep=keep)
            assert warm == _fresh({"field": text, "api_key": text}, keep), text
            mask_value({"field": text}, keep=keep)  # warm the memory again for the next comparison
    assert len(masking._CLEAN) <= masking._CLEAN_MOST


def test_only_short_strings_are_remembered_and_the_memory_is_bounded() -> None:
    long = "plain words " * 10
    mask_value({"a": long, "b": "planning"})
    assert long not in masking._CLEAN and "planning" in masking._CLEAN
    for i in range(masking._CLEAN_MOST + 10):
        mask_value(f"label {i}")
    assert len(masking._CLEAN) <= masking._CLEAN_MOST


def test_a_field_names_class_is_remembered_by_name_never_a_value() -> None:
    assert mask_value({"Api-Key": "x1", "card_no": "4111111111111111", "plain": "y"}) == {
        "Api-Key": masking.MASK, "card_no": "************1111", "plain": "y"}
    assert set(masking._KEYS) == {"Api-Key", "card_no", "plain"}
    assert mask_value({"Api-Key": "x2"}) == {"Api-Key": masking.MASK}
    assert mask_value({"plain": "z", "secret": "s"}, sensitive_fields=["plain"]) == {"plain": masking.MASK, "secret": masking.MASK}
