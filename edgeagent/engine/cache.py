"""Result cache: identical inputs to the same model version get the stored answer.

Edge apps often send the same frame twice (a static camera, a retry after a time-out); a hit
costs a hash instead of an inference. The key covers the model version and every input's name,
dtype, shape and bytes, so a new version or any differing byte is a miss. Bounded LRU: the
capacity is an entry count from ``[serving] cache_size`` / ``[server] cache_size``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np


def cache_key(version: str, feeds: Mapping[str, np.ndarray]) -> bytes:
    """A digest of the version and the inputs; blake2b is fast and collision-safe enough."""
    digest = hashlib.blake2b(version.encode(), digest_size=32)
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.data.cast("B"))
    return digest.digest()


class ResultCache:
    """A bounded LRU of answers. Stored arrays are read-only so no caller can alter an entry."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a result cache needs a capacity of at least 1")
        self.capacity = capacity
        self._entries: OrderedDict[bytes, dict[str, np.ndarray]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        answer = self._entries.get(key)
        if answer is not None:
            self._entries.move_to_end(key)
        return answer

    def put(self, key: bytes, answer: Mapping[str, np.ndarray]) -> None:
        frozen = {}
        for name, array in answer.items():
            copy = np.array(array, copy=True)
            copy.flags.writeable = False
            frozen[name] = copy
        self._entries[key] = frozen
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
