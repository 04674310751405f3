"""Each session's stored summaries, memoized in the process that writes them (SQLite).

A summarize policy (``balanced`` included) asks for the summaries covering a
prefix of the conversation on every request, and once more after the answer
(the prefetch): two reads of SQLite per request, most of them finding what
the last one found, or nothing. The SQLite store is served by one process
(``proxy check`` says so), and every write of a summary or delete goes
through it, so a memo invalidated by those writes is exact:

- ``save_summary`` adds the summary it stored to the session's entry (the
  entry was complete, and every summary since was added to it), and every
  delete (session, idle sessions, a response) invalidates, once committed;
  each bumps an epoch, and a read that began before a bump does not fill
  the memo with what it read (it may be stale);
- a session with no summaries is memoized too (an empty list): a request
  that needs no summary reads nothing.

Another process may still delete sessions (``python -m proxy sessions
delete`` on the same file): each memo entry holds the session's id, and the
next exchange the store commits for that session compares it with the id it
wrote to (as the chain cache does), forgetting the entry when they differ
(the session was deleted and made again, or made since). Until then, at most
the one request before that write may use a deleted session's summary, and
only for a history the client sent again whole (a summary is found only for
a conversation that covers its items).

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
        # (tenant, key) -> (the session's id, None for none; its summaries, oldest first)
        self._sessions: OrderedDict[tuple[str, str], tuple[int | None, list[StoredSummary]]] = (
            OrderedDict()
        )
        self._epoch = 0

    def __len__(self) -> int:
        return len(self._sessions)

    async def summaries(
        self,
        session: SessionRef,
        read: Callable[[], Awaitable[tuple[int | None, list[StoredSummary]]]],
    ) -> list[StoredSummary]:
        """The session's summaries, oldest first: memoized, or ``read()`` and memoized.

        ``read``: the session's id (None: no such session) and its summaries."""
        key = (session.tenant, session.key)
        found = self._sessions.get(key)
        if found is not None:
            self._sessions.move_to_end(key)
            return found[1]
        epoch = self._epoch
        found = await read()
        if epoch == self._epoch:
            self._sessions[key] = found
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return found[1]

    def known(self, session: SessionRef) -> list[StoredSummary] | None:
        """The session's summaries when memoized (no read, no change of order); else None."""
        found = self._sessions.get((session.tenant, session.key))
        return None if found is None else found[1]

    def written(self, session: SessionRef, session_id: int) -> None:
        """An exchange was committed to ``session_id``: a memo of another id is stale."""
        found = self._sessions.get((session.tenant, session.key))
        if found is not None and found[0] != session_id:
            del self._sessions[(session.tenant, session.key)]

    def saved(self, session: SessionRef, stored: StoredSummary) -> None:
        """A summary write committed: ``stored`` is the session's summary for its range
        (the one it wrote, or the one stored first). Added to the entry, no read again."""
        self._epoch += 1
        key = (session.tenant, session.key)
        found = self._sessions.get(key)
        if found is None:
            return
        session_id, summaries = found
        if session_id != stored.session_id:
            del self._sessions[key]  # the session made since the entry was read
        elif all(s.id != stored.id for s in summaries):
            # A new list: callers may hold the old one.
            self._sessions[key] = (session_id, [*summaries, stored])

    def changed(self, session: SessionRef | None = None) -> None:
        """A write committed: forget ``session``'s summaries (None: every session's)."""
        self._epoch += 1
        if session is None:
            self._sessions.clear()
        else:
            self._sessions.pop((session.tenant, session.key), None)
