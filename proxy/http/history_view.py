"""Each session's stored chain as last replayed: ``history: server`` turns do what is new.

A chat route with server-held history replays the session's stored chain
before every call. Two things were redone over every item on every turn, so
a turn cost more the longer the session:

- the check (:func:`proxy.http.shape.check_chat_history`): a session the
  Responses API wrote is refused, and replies that were not whole answers are
  left out;
- each item's token count for the request's tokenizer.

Items are never rewritten and ids are never reused, so the chain up to an
item is fixed by that item's id: when the chain read now holds, at the
position seen last, the item seen last, everything before it had the same
outcome then, and only the items after it are checked and counted.

Only numbers are kept (positions and counts), never an item or its message:
what the store's own chain cache drops is freed, and this memo holds no
text (a cache of the items' messages here would keep them alive unseen by
the chain cache's budget).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import NamedTuple

from proxy.http.shape import check_chat_history
from proxy.store.base import SessionRef, StoredItem

# Sessions remembered, least recently used evicted, and items counted in all: an
# entry keeps 4 bytes per item of its chain (its counts, as a C array), so the
# memo holds at most ~16 MB whatever the sessions' lengths.
SESSIONS = 1024
MAX_ITEMS = 4_000_000


class HistoryView(NamedTuple):
    # Positions in the chain to leave out of what is forwarded.
    left_out: list[int]
    # Each item's token count, by the request's tokenizer.
    counts: list[int]


class _Seen(NamedTuple):
    length: int  # items seen
    last_id: int  # the id of the last of them
    left_out: tuple[int, ...]
    how: Hashable  # what the counts are for (the tokenizer's name and scale)
    counts: array[int]  # unsigned 32-bit


class HistoryViews:
    def __init__(self, max_sessions: int = SESSIONS, max_items: int = MAX_ITEMS) -> None:
        self.max_sessions = max_sessions
        self.max_items = max_items
        self._sessions: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._items = 0  # counts held, in all entries

    @property
    def items(self) -> int:
        return self._items

    def __len__(self) -> int:
        return len(self._sessions)

    def view(
        self,
        ref: SessionRef,
        history: Sequence[StoredItem],
        how: Hashable,
        count: Callable[[StoredItem], int],
    ) -> HistoryView:
        """``history`` checked (raising as :func:`check_chat_history` does) and counted
        by ``count`` (a count for ``how``), the items seen last time not again."""
        slot = (ref.tenant, ref.key)
        seen = self._sessions.pop(slot, None)
        if seen is not None:
            self._items -= len(seen.counts)
        start = 0
        left_out: list[int] = []
        counts: array[int] = array("I")
        if (
            seen is not None
            and 0 < seen.length <= len(history)
            and history[seen.length - 1].id == seen.last_id
        ):
            start, left_out = seen.length, list(seen.left_out)
            if seen.how == how:
                counts = seen.counts
        left_out += check_chat_history(history, ref.key, start=start)
        counts.extend(map(count, history[len(counts) :]))
        if history and len(counts) <= self.max_items:
            self._sessions[slot] = _Seen(len(history), history[-1].id, tuple(left_out), how, counts)
            self._items += len(counts)
            while len(self._sessions) > self.max_sessions or self._items > self.max_items:
                _, dropped = self._sessions.popitem(last=False)
                self._items -= len(dropped.counts)
        return HistoryView(left_out, counts.tolist())
