"""Tokens → text a client may be shown: whole UTF-8 characters, stop strings held back.

A token's bytes may end in the middle of a character (emoji and CJK often span two or three
tokens), so pieces go through an incremental UTF-8 decoder that keeps the partial bytes for
the next token. A stop string may likewise arrive split over tokens: the tail of the text
that could still be the start of a stop string is held back until the next token says
either way, and when a stop string completes, the text before it is the last chunk.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextAssembler:
    """One sequence's output text, fed token pieces; returns what may be sent now."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stop = tuple(s for s in stop if s)
        self._held = ""  # decoded text not yet sent: it may begin a stop string
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        """Text that is now certain; sets ``stopped`` when a stop string completed."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(piece)
        return self._release()

    def finish(self) -> str:
        """The rest at the end of generation (an incomplete character becomes U+FFFD)."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(b"", final=True)
        text = self._release()
        text, self._held = text + self._held, ""
        return text

    def _release(self) -> str:
        text = self._held
        found = [(text.find(s), s) for s in self._stop if s in text]
        if found:
            self.stopped = True
            self._held = ""
            return text[: min(index for index, _ in found)]
        hold = max((_overlap(text, s) for s in self._stop), default=0)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]


def _overlap(text: str, stop: str) -> int:
    """The longest end of ``text`` that is a beginning of ``stop`` (shorter than ``stop``)."""
    for size in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-size:]):
            return size
    return 0
