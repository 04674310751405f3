"""Each session's stored summaries, memoized in the process that writes them (SQLite).

A summarize policy (``balanced`` included) asks for the summaries covering a
prefix of the conversation on every request, and once more after the answer
(the prefetch): two reads of SQLite per request, most of them finding what
the last one found, or nothing. The SQLite store is served by one process
(``proxy check`` says so), and every write of a summary or delete goes
through it, so a memo invalidated by those writes is exact:

- ``save_summary`` and every delete (session, idle sessions, a response)
  invalidate once committed; each bumps an epoch, and a read that began
  before a bump does not fill the memo with what it read (it may be stale);
- a session with no summaries is memoized too (an empty list): a request
  that needs no summary reads nothing.

Summaries are never rewritten once stored and their ids are never reused, so
the memoized values are the rows as stored; callers must not mutate them.
Bounded by sessions (least recently used first out).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

from proxy.store.base import SessionRef, StoredSummary


class SummaryMemo:
    def __init__(self, max_sessions: int = 1024) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[tuple[str, str], list[StoredSummary]] = OrderedDict()
        self._epoch = 0

    def __len__(self) -> int:
        return len(self._sessions)

    async def summaries(
        self, session: SessionRef, read: Callable[[], Awaitable[list[StoredSummary]]]
    ) -> list[StoredSummary]:
        """The session's summaries, oldest first: memoized, or ``read()`` and memoized."""
        key = (session.tenant, session.key)
        found = self._sessions.get(key)
        if found is not None:
            self._sessions.move_to_end(key)
            return found
        epoch = self._epoch
        found = await read()
        if epoch == self._epoch:
            self._sessions[key] = found
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return found

    def changed(self, session: SessionRef | None = None) -> None:
        """A write committed: forget ``session``'s summaries (None: every session's)."""
        self._epoch += 1
        if session is None:
            self._sessions.clear()
        else:
            self._sessions.pop((session.tenant, session.key), None)
