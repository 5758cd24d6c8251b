"""The stream masker: a secret split anywhere across pieces never leaves unmasked."""

from __future__ import annotations

import pytest

from audit.masking import mask_text
from audit.stream_masking import StreamMasker

SECRETS = [
    "sk-proj-CANARY0123456789abcdefXYZ",
    "4111 1111 1111 1111",
    "4111.1111.1111.1111",
    "4111\n1111\n1111\n1111",
    "4111 1111\r\n1111 1111",
    "password: hunter2x9",
    "my password is Hunter2!",
    "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlMTIz",
    "密码：abc12345",
    "+86 138 1234 5678",
    "138-1234-5678",
    "the api key is sk-live-ABCDEF0123456789xyz",
    "token was Abc123XYZ987",
    "Bearer Zm9vYmFyYmF6cXV4MTIz",
    "jane.doe@example.com",
]


def _stream(text: str, sizes: list[int]) -> tuple[list[str], str]:
    masker = StreamMasker()
    out, at, i = [], 0, 0
    while at < len(text):
        size = sizes[i % len(sizes)]
        out.append(masker.feed(text[at : at + size]))
        at, i = at + size, i + 1
    out.append(masker.finish())
    return out, "".join(out)


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("sizes", [[1], [2, 3], [5], [7, 1, 4]])
def test_a_secret_split_across_pieces_is_masked_and_the_text_is_the_masked_whole(secret: str, sizes: list[int]) -> None:
    # given a reply with the secret in the middle, streamed in pieces of every shape
    text = f"Here is what you asked for: {secret} and some more words after it to end the reply."
    # when it passes the masker piece by piece
    pieces, whole = _stream(text, sizes)
    # then the released text is the masked whole, and no released prefix ever held the secret's raw tail
    assert whole == mask_text(text)
    released = ""
    for piece in pieces:
        released += piece
        assert released == mask_text(text)[: len(released)]
    assert "hunter2" not in whole and "CANARY" not in whole and "1111 1111 1111" not in whole and "4111" not in whole


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("sizes", [[1], [3], [6, 2]])
def test_a_secret_after_plain_prose_is_masked_although_prose_streams_word_by_word(secret: str, sizes: list[int]) -> None:
    # plain prose before the secret has nothing that begins a secret spanning words, so it is released early;
    # the secret must still never leave raw
    text = f"Here is what you asked for so please keep it safe {secret} and some more words after it end here"
    pieces, whole = _stream(text, sizes)
    assert whole == mask_text(text) and "4111" not in whole
    released = ""
    for piece in pieces:
        released += piece
        assert released == mask_text(text)[: len(released)]


def test_plain_prose_is_released_word_by_word_without_the_hold() -> None:
    # each word leaves as soon as the whitespace after it arrives: no 48-character wait for the first delta
    masker = StreamMasker()
    assert masker.feed("Hello") == ""  # the last word may still grow into a one-word secret
    assert masker.feed(" there") == "Hello "
    assert masker.feed(" how are you") == "there how are "
    # a trailing number run (a card, a phone number may be coming) waits whole; what is before it leaves
    assert masker.feed(" 4111") == "you "
    assert masker.feed(" 1111 1111") == ""
    assert masker.feed(" 1111 ok") == "**** **** **** 1111 "  # complete: it leaves masked
    assert masker.finish() == "ok"
    # digits inside words (order numbers, "word0") do not hold the prose before them
    masker = StreamMasker()
    assert masker.feed("see word0 and") == "see word0 "
    # a secret word in the tail brings the full hold back
    masker = StreamMasker()
    assert masker.feed("your password is") == ""


def test_text_without_secrets_is_released_before_the_reply_ends() -> None:
    masker = StreamMasker()
    released = "".join(masker.feed(w + " ") for w in ["word"] * 40)
    assert released and len(released) >= 40 * 5 - 48 - 5


def test_a_long_run_without_whitespace_is_released_past_max_hold() -> None:
    masker = StreamMasker(max_hold=100)
    released = "".join(masker.feed("字") for _ in range(400))
    assert len(released) >= 400 - 48 - 100


def test_a_long_reply_in_many_pieces_costs_linear_time_and_keeps_masking_late_secrets() -> None:
    import time

    text = " ".join(f"token{i:05d}" for i in range(20000)) + f" and finally {SECRETS[0]} and {SECRETS[1]} end of reply."
    masker = StreamMasker()
    started = time.perf_counter()
    out = "".join(masker.feed(text[i : i + 50]) for i in range(0, len(text), 50)) + masker.finish()
    assert time.perf_counter() - started < 20  # re-masking the whole reply per piece: minutes
    assert out == mask_text(text) and "CANARY" not in out

