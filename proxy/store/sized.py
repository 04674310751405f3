"""A least-recently-used map bounded by entries and by the bytes its values are said to take.

The stores' per-session caches (histories) keep one of these: each value
comes with its estimated size, and the oldest entries go once either bound
is passed. A value larger than the whole budget is not kept at all.

With ``admission`` (the per-session caches of whole histories), the map
also counts each key's recent uses (:class:`Uses`), cached or not, and
does not collapse on a loop. Clients cycling over more sessions than fit
(64 agents, each sending in turn) make a plain LRU evict every session just
before its next use: no hits at all. Here:

- a key not held is admitted only if entries used less than it, least
  recently used first, free the room it needs (an entry used at most once
  is fair game for anyone, so one-off sessions still come and go as in a
  plain LRU); hotter entries are passed over, not evicted. When there are
  not enough colder ones the key is not kept, and the sessions held keep
  their hits: on a loop the cache keeps a fixed share of the sessions, and
  hits on those, where a plain LRU evicts each just before its next use;
- an entry that grows (a session's next turn) evicts the least recently
  used entries used no more than it, then, if that is not enough, any.

Uses are halved every ``10 x`` the keys tracked, so a set of sessions that
stopped being used gives way to the next.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

# What tracking one key's uses takes: its dict slot and key tuple (86 bytes,
# tracemalloc), and the key's strings when no entry shares them (a 64-character
# session key: 113 more); the count is a small int.
USE_BYTES = 240
# Counts saturate here (as TinyLFU's 4-bit counters): a session used a
# thousand times yesterday must not outlive a day of halvings.
MAX_USES = 15


class Uses(Generic[K]):
    """Recent uses per key, at most ``max_keys`` keys; all halved every ``10 x max_keys`` uses."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self._n: dict[K, int] = {}
        self._since = 0

    def __len__(self) -> int:
        return len(self._n)

    def add(self, key: K) -> None:
        if self.max_keys <= 0:
            return
        n = self._n
        n[key] = min(n.get(key, 0) + 1, MAX_USES)
        self._since += 1
        if self._since >= 10 * self.max_keys or len(n) > self.max_keys:
            self.age()

    def get(self, key: K) -> int:
        return self._n.get(key, 0)

    def age(self) -> None:
        """Halve every count (a key used once is forgotten)."""
        self._since = 0
        kept = {k: v >> 1 for k, v in self._n.items() if v > 1}
        if len(kept) > self.max_keys:  # every key used twice or more: the most used stay
            ranked = sorted(kept.items(), key=lambda kv: kv[1], reverse=True)
            kept = dict(ranked[: self.max_keys // 2])
        self._n = kept


class SizedLRU(Generic[K, V]):
    def __init__(self, max_entries: int, max_bytes: int, *, admission: bool = False) -> None:
        self.max_entries = max_entries
        self._max_bytes = max_bytes
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._uses: Uses[K] | None = Uses(self._max_keys()) if admission else None

    def _max_keys(self) -> int:
        # Twice the sessions held, within a sixteenth of the budget, taken off
        # what the entries may hold; a cache too small to track 16 keys tracks
        # none (a plain LRU).
        keys = min(2 * self.max_entries, self._max_bytes // 16 // USE_BYTES)
        return keys if keys >= 16 else 0

    @property
    def _room(self) -> int:
        """What the entries may take: the budget less what tracking uses may take."""
        return self._max_bytes - (self._uses.max_keys * USE_BYTES if self._uses is not None else 0)

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._max_bytes = value
        if self._uses is not None:
            self._uses.max_keys = self._max_keys()
        while self._bytes > self._room and self._data:
            _, (_, dropped) = self._data.popitem(last=False)
            self._bytes -= dropped

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size(self) -> int:
        """Bytes held, as the values' sizes were given, and by the uses tracked."""
        return self._bytes + (len(self._uses) * USE_BYTES if self._uses is not None else 0)

    def get(self, key: K) -> V | None:
        """The value held for ``key``; with admission, one use of ``key`` (held or not)."""
        if self._uses is not None:
            self._uses.add(key)
        found = self._data.get(key)
        return None if found is None else found[0]

    def peek(self, key: K) -> V | None:
        """The value held for ``key``, no use counted."""
        found = self._data.get(key)
        return None if found is None else found[0]

    def touch(self, key: K) -> None:
        """``key`` was just used: the last to go."""
        self._data.move_to_end(key)

    def put(self, key: K, value: V, size: int) -> bool:
        """Hold ``value`` (replacing ``key``'s); False if it was not kept (too large, or
        not admitted: see the module docstring)."""
        old = self._data.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if size > self._room:
            return False
        uses = self._uses
        if uses is not None:
            need = self._bytes + size - self._room
            extra = len(self._data) + 1 - self.max_entries
            if need > 0 or extra > 0:
                if old is None:
                    # Admission: only entries used less than ``key`` make room for it.
                    victims = self._victims(need, extra, max(uses.get(key), 2))
                    if victims is None:
                        return False
                else:
                    # Growth: entries used no more than ``key`` go first, then any.
                    victims = self._victims(need, extra, uses.get(key) + 1) or []
                for victim in victims:
                    self._bytes -= self._data.pop(victim)[1]
        self._data[key] = (value, size)
        self._bytes += size
        while (self._bytes > self._room or len(self._data) > self.max_entries) and self._data:
            _, (_, dropped) = self._data.popitem(last=False)
            self._bytes -= dropped
        return key in self._data

    def drop(self, key: K) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self._bytes -= old[1]

    def _victims(self, need: int, extra: int, colder_than: int) -> list[K] | None:
        """Least recently used entries used fewer than ``colder_than`` times that free
        ``need`` bytes and ``extra`` entries (None: not enough of them)."""
        assert self._uses is not None
        uses = self._uses
        out: list[K] = []
        for victim, (_, victim_size) in self._data.items():  # least recently used first
            if uses.get(victim) >= colder_than:
                continue
            out.append(victim)
            need -= victim_size
            extra -= 1
            if need <= 0 and extra <= 0:
                return out
        return None
