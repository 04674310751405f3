"""A least-recently-used map bounded by entries and by the bytes its values are said to take.

The stores' per-session caches (histories) keep one of these: each value
comes with its estimated size, and the oldest entries go once either bound
is passed. A value larger than the whole budget is not kept at all.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SizedLRU(Generic[K, V]):
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size(self) -> int:
        """Bytes held, as the values' sizes were given."""
        return self._bytes

    def get(self, key: K) -> V | None:
        found = self._data.get(key)
        return None if found is None else found[0]

    def touch(self, key: K) -> None:
        """``key`` was just used: the last to go."""
        self._data.move_to_end(key)

    def put(self, key: K, value: V, size: int) -> None:
        self.drop(key)
        if size > self.max_bytes:
            return
        self._data[key] = (value, size)
        self._bytes += size
        while self._bytes > self.max_bytes or len(self._data) > self.max_entries:
            _, (_, dropped) = self._data.popitem(last=False)
            self._bytes -= dropped

    def drop(self, key: K) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
