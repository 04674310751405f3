"""A least-recently-used map bounded by entries and by the bytes its values are said to take.

The stores' per-session caches (histories) keep one of these: each value
comes with its estimated size, and the oldest entries go once either bound
is passed. A value larger than the whole budget is not kept at all.

With ``admission`` (the per-session caches of whole histories), the map
also counts each key's recent uses (:class:`Uses`), cached or not, and
does not collapse on a loop. Clients cycling over more sessions than fit
(64 agents, each sending in turn) make a plain LRU evict every session just
before its next use: no hits at all. Here:

- a key not held is admitted only if colder entries, least recently used
  first, free the room it needs; the others are passed over, not evicted.
  Colder: used fewer times than the key (an entry used at most once is fair
  game for anyone, so one-off sessions come and go as in a plain LRU) and
  idle for longer than the key's own reuse distance; or stopped: idle past
  twice its longest reuse distance lately (a session that ended gives way
  at once, whatever its uses were). When there are not enough colder
  entries the key is not kept, and the sessions held keep their hits: on a
  loop the cache keeps a fixed share of the sessions and hits on those,
  where a plain LRU evicts each just before its next use;
- an entry that grows (a session's next turn) evicts the least recently
  used entries used no more than it (or stopped) first, then, if that is
  not enough, any.

Uses and longest distances are halved every ``10 x`` the keys tracked.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

# What tracking one key's uses takes: its dict slot, key tuple and (uses, last,
# gap, longest gap) tuple (~240 bytes, tracemalloc), and the key's strings when no entry shares
# them (a 64-character session key: 113 more).
USE_BYTES = 360
# Counts saturate here (as TinyLFU's 4-bit counters): a session used a
# thousand times yesterday must not outlive a day of halvings.
MAX_USES = 15


class Uses(Generic[K]):
    """Per key (at most ``max_keys``): its recent uses, halved every ``10 x max_keys``
    uses of any key; when it was last used, and how long before that (its reuse
    distance), both counted in uses of any key."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        # key -> (uses, last use, reuse distance before it, longest lately)
        self._n: dict[K, tuple[int, int, int, int]] = {}
        self._clock = 0
        self._since = 0

    def __len__(self) -> int:
        return len(self._n)

    def add(self, key: K) -> None:
        if self.max_keys <= 0:
            return
        self._clock = clock = self._clock + 1
        old = self._n.get(key)
        if old is None:
            self._n[key] = (1, clock, 0, 0)
        else:
            gap = clock - old[1]
            self._n[key] = (min(old[0] + 1, MAX_USES), clock, gap, max(gap, old[3]))
        self._since += 1
        if self._since >= 10 * self.max_keys or len(self._n) > self.max_keys:
            self.age()

    def get(self, key: K) -> int:
        """Recent uses of ``key``."""
        found = self._n.get(key)
        return 0 if found is None else found[0]

    def idle(self, key: K) -> int | None:
        """Uses of any key since ``key``'s last (None: not tracked)."""
        found = self._n.get(key)
        return None if found is None else self._clock - found[1]

    def gap(self, key: K) -> int:
        """Uses of any key between ``key``'s last two (0: used once, as far as is known)."""
        found = self._n.get(key)
        return 0 if found is None else found[2]

    def stopped(self, key: K) -> bool:
        """Whether ``key`` has been idle for more than twice its longest reuse distance
        lately (a key used once: at all; a key not tracked: yes)."""
        found = self._n.get(key)
        return found is None or self._clock - found[1] > 2 * found[3]

    def age(self) -> None:
        """Halve every count and longest distance (a key used once is forgotten)."""
        self._since = 0
        kept = {k: (v[0] >> 1, v[1], v[2], v[3] >> 1) for k, v in self._n.items() if v[0] > 1}
        if len(kept) > self.max_keys:  # every key used twice or more: the most used stay
            ranked = sorted(kept.items(), key=lambda kv: kv[1][0], reverse=True)
            kept = dict(ranked[: self.max_keys // 2])
        self._n = kept


class SizedCache(Generic[K, V]):
    """A cache kept in one :class:`SizedLRU` (``_entries``): how many it holds, the bytes
    they take and its budget are the map's (the runtime sets the budget from
    ``cache.max_bytes``)."""

    _entries: SizedLRU[K, V]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes held, as estimated by the cache that put them."""
        return self._entries.size

    @property
    def max_bytes(self) -> int:
        return self._entries.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._entries.max_bytes = value


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

    def spare(self, key: K) -> int:
        """The bytes a value for ``key`` may take (replacing ``key``'s) with nothing evicted."""
        found = self._data.get(key)
        return self._room - self._bytes + (found[1] if found is not None else 0)

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
                    # Admission: only entries colder than ``key`` make room for it.
                    victims = self._victims(need, extra, max(uses.get(key), 2), uses.gap(key))
                    if victims is None:
                        return False
                else:
                    # Growth: entries used no more than ``key`` go first, then any.
                    victims = self._victims(need, extra, uses.get(key) + 1, None) or []
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

    def _victims(self, need: int, extra: int, colder_than: int, gap: int | None) -> list[K] | None:
        """Least recently used entries that free ``need`` bytes and ``extra`` entries
        (None: not enough of them): entries that stopped being used (idle past twice
        their longest reuse distance lately), and entries used fewer than
        ``colder_than`` times and (``gap`` given) idle for longer than ``gap``.

        ``gap``: the candidate's reuse distance (0: seen for the first time). On
        a loop every entry held came back as regularly as the candidate and was
        used more recently than the candidate's last turn, so none is evicted; a
        session that ended (20 turns, then nothing) is, at once.
        """
        assert self._uses is not None
        uses = self._uses
        out: list[K] = []
        for victim, (_, victim_size) in self._data.items():  # least recently used first
            if not uses.stopped(victim):
                if uses.get(victim) >= colder_than:
                    continue
                if gap is not None:
                    idle = uses.idle(victim)
                    if idle is not None and idle <= gap:
                        continue
            out.append(victim)
            need -= victim_size
            extra -= 1
            if need <= 0 and extra <= 0:
                return out
        return None
