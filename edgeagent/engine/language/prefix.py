"""Prefix caching: a new sequence starts from KV cache another one already computed.

Chat clients resend the same system prompt (and, turn after turn, the whole conversation so
far) with every request. The KV cache of a finished sequence is kept in its slot while slots
are free (``Retained``, least recently used evicted first); a new prompt that begins with the
tokens some running or kept sequence has cached shares them (``copy_prefix``: llama.cpp adds
the cells to the new sequence, no copy) and is fed only from where they differ.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

# Shorter matches are not worth a copy and the bookkeeping (a BOS and a role header).
MIN_PREFIX = 16


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    size = min(len(a), len(b))
    for index in range(size):
        if a[index] != b[index]:
            return index
    return size


def best_source(
    prompt: Sequence[int], sources: Iterable[tuple[int, Sequence[int]]]
) -> tuple[int, int] | None:
    """(slot, length) of the longest cached prefix of ``prompt``, leaving at least one prompt
    token to feed (its logits start the answer); None below ``MIN_PREFIX``."""
    best: tuple[int, int] | None = None
    for slot, cached in sources:
        length = min(common_prefix(prompt, cached), len(prompt) - 1)
        if length >= MIN_PREFIX and (best is None or length > best[1]):
            best = (slot, length)
    return best


class Retained:
    """Finished sequences' slots kept with their cached tokens, least recently used first."""

    def __init__(self) -> None:
        self._slots: OrderedDict[int, list[int]] = OrderedDict()

    def keep(self, slot: int, tokens: list[int]) -> None:
        self._slots[slot] = tokens
        self._slots.move_to_end(slot)

    def items(self) -> list[tuple[int, list[int]]]:
        return list(self._slots.items())

    def touch(self, slot: int) -> None:
        if slot in self._slots:
            self._slots.move_to_end(slot)

    def evict(self, keep: int | None = None) -> int | None:
        """The least recently used slot (never ``keep``), forgotten; None when there is none."""
        for slot in self._slots:
            if slot != keep:
                del self._slots[slot]
                return slot
        return None

    def pop(self, slot: int) -> None:
        self._slots.pop(slot, None)

    @property
    def tokens(self) -> int:
        return sum(len(tokens) for tokens in self._slots.values())

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, slot: object) -> bool:
        return slot in self._slots
