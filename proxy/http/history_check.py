"""Each session's stored chain as checked last: a ``history: server`` turn checks what is new.

A chat route with server-held history checks the chain it replays before
every call (:func:`proxy.http.shape.check_chat_history`): a session the
Responses API wrote is refused, and replies that were not whole answers are
left out. That walked every item of the chain on every turn, so a turn cost
more the longer the session. Items are never rewritten and ids are never
reused, so the chain up to an item is fixed by that item's id: when the
chain read now holds, at the position checked last, the item checked last,
everything before it passed the same check with the same outcome, and only
the items after it are checked.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from proxy.http.shape import check_chat_history
from proxy.store.base import SessionRef, StoredItem

# Sessions remembered (a few hundred bytes each), least recently used evicted.
SESSIONS = 1024


class _Checked(NamedTuple):
    length: int  # items checked
    last_id: int  # the id of the last of them
    left_out: tuple[int, ...]


class HistoryChecks:
    def __init__(self, max_sessions: int = SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[tuple[str, str], _Checked] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def left_out(self, ref: SessionRef, history: Sequence[StoredItem]) -> list[int]:
        """:func:`check_chat_history` of ``history`` (raising as it does), new items only."""
        slot = (ref.tenant, ref.key)
        seen = self._sessions.get(slot)
        start = 0
        known: tuple[int, ...] = ()
        if (
            seen is not None
            and 0 < seen.length <= len(history)
            and history[seen.length - 1].id == seen.last_id
        ):
            start, known = seen.length, seen.left_out
        left_out = [*known, *check_chat_history(history, ref.key, start=start)]
        if history:
            self._sessions[slot] = _Checked(len(history), history[-1].id, tuple(left_out))
            self._sessions.move_to_end(slot)
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.pop(slot, None)
        return left_out
