"""The one error the packager raises: it names the file and what to pass instead."""

from __future__ import annotations

import re


class PackagingError(ValueError):
    """A source or option the packager cannot use; the message says which flag fixes it."""


# How much of a converter's own words a report keeps: OpenVINO's conversion failures put the
# operator that failed and why on their third to tenth lines, after a source location.
MESSAGE_CHARS = 1500


def converter_message(exc: BaseException, limit: int = MESSAGE_CHARS) -> str:
    """A converter's whole useful message on one line: every non-blank line, joined.

    Lines that only point into the converter's C++ sources (``Check 'x' failed at
    src/…cpp:12:``) or are decoration are dropped; what remains is cut to ``limit``.
    """
    lines = [line.strip() for line in str(exc).splitlines()]
    useful = [
        line
        for line in lines
        if line and not set(line) <= set("-=*#") and not _SOURCE_LOCATION.fullmatch(line)
    ]
    text = " | ".join(useful) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


_SOURCE_LOCATION = re.compile(r"(Check '.*' failed at )?\S+\.(cpp|hpp|cc|h):\d+:?")
