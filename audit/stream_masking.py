"""Masking text that arrives in pieces (a model's streamed reply), so no secret leaves split across two pieces.

Masking each piece on its own would miss ``sk-proj-…`` cut as ``sk-pr`` + ``oj-…``, or a card number
whose groups arrive one by one. Masking only completed words would still miss secrets that span words
(``password: hunter2``, ``4111 1111 1111 1111``). So :class:`StreamMasker` keeps the whole text of the
reply, masks all of it on each piece (with the same :func:`~audit.masking.mask_text` as every other
path, so a label seen earlier still masks the value that follows), and releases only a *stable* prefix:
it holds back the last ``hold`` characters and cuts at a word boundary before them, so a word (a key,
a token) is never released until it is followed by whitespace and ``hold`` more characters. A secret
shorter than ``hold`` is therefore always whole — and masked — before any part of it is released.

If the masked text ever stops extending what was already released (a pattern longer than the window
reached back), the masker releases nothing more for this reply: the client gets the final, masked
message from the committed trace instead. Cost: each piece re-masks only the reply's last ``keep`` to
``2 * keep`` characters: the head of the text is dropped from the window once masking it apart from the
rest gives the same text (checked), so a long reply costs linear time, not quadratic.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from audit.masking import _SECRET_KEY_WORDS, mask_text

HOLD = 48  # characters held back; longer than any multi-word secret the patterns know (cards, phones, "key: value")
MAX_HOLD = 512  # with no whitespace for this long, release up to the window anyway (e.g. text without spaces)
KEEP = 256  # raw characters always re-masked with each piece: the context a pattern may need, and then some
BATCH = 16  # raw characters gathered before masking again, unless a piece brings whitespace (a possible cut)


#: The secrets of :mod:`audit.masking` that span whitespace are numbers written in groups (cards, phones, id
#: numbers: digits, ``+``, spaces, dashes, and for cards dots, tabs and a line break); all the others are one word
#: after a label the mask keeps (``password is ****``, ``Bearer ****``, ``密码：****``). So only a trailing run that
#: may still grow into such a number must wait in full, and, to stay on the safe side, a tail naming a secret word or
#: an authorization scheme.
_NUMBER_RUN = re.compile(r"[+\d][\d \-+.\t\r\n]*$")
_SECRET_WORD = re.compile(rf"(?i){_SECRET_KEY_WORDS}|bearer|basic|digest|authorization|密码|口令|密钥|秘钥|令牌|验证码|安全码|私钥")


class StreamMasker:
    def __init__(
        self, mask: Callable[[str], str] = mask_text, *, hold: int = HOLD, max_hold: int = MAX_HOLD, keep: int = KEEP
    ) -> None:
        self._mask = mask
        self.hold = hold
        self.max_hold = max_hold
        self.keep = keep
        self._window = ""  # the raw text not yet known to mask on its own (the reply's tail)
        self._released = ""  # what was released of mask(_window)
        self._unmasked = 0  # raw characters fed since the window was last masked
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Take the next raw piece; return the masked text that may be released now (often empty)."""
        self._window += piece
        self._unmasked += len(piece)
        if self._unmasked < BATCH and not any(ch.isspace() for ch in piece):
            return ""
        self._unmasked = 0
        masked = self._mask(self._window)
        out = self._release(masked, self._cut(masked))
        if len(self._window) > 2 * self.keep:
            self._rebase(masked)
        return out

    def finish(self) -> str:
        """The reply is complete: release the rest."""
        self._unmasked = 0
        masked = self._mask(self._window)
        return self._release(masked, len(masked))

    def _cut(self, masked: str) -> int:
        start, limit = len(self._released), len(masked) - self.hold
        if not _SECRET_WORD.search(masked, max(start, limit, 0)):
            # nothing in the held-back tail names a secret: only a trailing number run (it may grow into a card or
            # a phone number) and the last word (it may grow into a one-word secret) wait, so prose streams word
            # by word without the full hold
            run = _NUMBER_RUN.search(masked, max(start, limit, 0))
            limit = run.start() if run else len(masked)
        if limit <= start:
            return start
        for index in range(limit - 1, start - 1, -1):
            if masked[index].isspace():
                return index + 1
        return limit if limit - start >= self.max_hold else start

    def _release(self, masked: str, cut: int) -> str:
        if self.stopped:
            return ""
        if not masked.startswith(self._released):
            self.stopped = True  # what was released is no longer a prefix of the masked text: release no more
            return ""
        if cut <= len(self._released):
            return ""
        out = masked[len(self._released) : cut]
        self._released = masked[:cut]
        return out

    def _rebase(self, masked: str) -> None:
        """Drop the window's released head where masking it apart changes nothing, so each piece costs O(keep)."""
        split = self._window.rfind(" ", 0, len(self._window) - self.keep)
        if split <= 0:
            return
        left, right = self._mask(self._window[: split + 1]), self._mask(self._window[split + 1 :])
        if left + right == masked and len(left) <= len(self._released):
            self._window = self._window[split + 1 :]
            self._released = self._released[len(left) :]
