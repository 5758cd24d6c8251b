"""Numbers typed by people and clients: ``str.isdigit()`` is true for "²" and "٣", which ``int()`` refuses or reads
as another digit, and for 5,000 nines, which ``int()`` refuses past 4,300 digits. Everything that turns a typed id,
count or port into an ``int`` goes through ``whole_number``."""

from __future__ import annotations

#: Digits of the largest number accepted (a 64-bit column holds 18 of them safely).
MAX_DIGITS = 18


def whole_number(text: str, *, digits: int = MAX_DIGITS) -> int | None:
    """``text`` as a non-negative integer when it is 1 to ``digits`` ASCII digits; otherwise None."""
    if 0 < len(text) <= digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def number_or_text(text: str) -> int | str:
    """A typed number as an int; anything else as typed, for the service to refuse naming its field."""
    number = whole_number(text)
    return text if number is None else number
