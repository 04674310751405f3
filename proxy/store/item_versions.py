"""Each session's stored items as this process saw them change: a version for memos over them.

The recall step memoizes what it recalled for a request (proxy/context/
recall_memo.py); a resent request over a session whose items are as they
were recalls the same. The SQLite store is served by one process (``proxy
check`` says so) and every write of items goes through it, so it can say
when a session's items (and with them its recall index) may have changed:

- an exchange committed: item ids only grow (AUTOINCREMENT), so a new item
  has an id above every item this process saw committed to the session; an
  exchange whose items all have lower ids added none (a resent history);
- a response committed, a summary saved (it stores the items it covers),
  any delete: the session (or every session) gets a new version.

A session this process has not seen an exchange of has no version (None):
nothing is memoized for it until one commits. Versions are never reused, so
an entry memoized under an old one is never matched again. Another process
may still delete a session (``python -m proxy sessions delete``): the next
exchange committed for it is to another session id, which gives a new
version (as in proxy/store/summary_memo.py).

Bounded as the memos over it are (1,024 sessions, least recently committed
first out): a version outliving the recall memo's entry for its session
serves nothing, and until this bound matched theirs (it was 4,096) the map
kept growing past the sessions they hold (~300 bytes a session: its key,
its id and two counters; bench/history.py, memory).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from proxy.store.base import SessionRef

# The sessions proxy/context/recall_memo.py memoizes (and the other per-session caches keep).
SESSIONS = 1024


class ItemVersions:
    def __init__(self, max_sessions: int = SESSIONS) -> None:
        self.max_sessions = max_sessions
        # (tenant, key) -> (session id, the highest item id committed to it, its version)
        self._sessions: OrderedDict[tuple[str, str], tuple[int, int, int]] = OrderedDict()
        self._last = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def version(self, session: SessionRef) -> int | None:
        """The session's items' version (None: unknown here, memoize nothing)."""
        found = self._sessions.get((session.tenant, session.key))
        return None if found is None else found[2]

    def committed(self, session: SessionRef, session_id: int, ids: Iterable[int]) -> None:
        """An exchange of ``ids`` (its items, old and new) was committed to ``session_id``."""
        key = (session.tenant, session.key)
        top = max(ids, default=0)
        found = self._sessions.get(key)
        if found is not None and found[0] == session_id and top <= found[1]:
            self._sessions.move_to_end(key)
            return  # nothing new: every id was there before
        if found is not None and found[0] == session_id:
            top = max(top, found[1])
        self._last += 1
        self._sessions[key] = (session_id, top, self._last)
        self._sessions.move_to_end(key)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)

    def changed(self, session: SessionRef | None = None) -> None:
        """Items of ``session`` (None: of any session) may have been added or deleted."""
        if session is None:
            self._sessions.clear()
        else:
            self._sessions.pop((session.tenant, session.key), None)
