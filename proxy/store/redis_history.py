"""Each session's last read history (Redis), checked against the session before use.

A ``history: server`` request reads its session's whole chain before every
call: without a cache, a Lua walk of every item and every item's JSON over
the wire and parsed again, more with every turn. This per-instance cache
keeps the chain last read per session (parsed once, as the SQLite and
PostgreSQL stores do). Every read is still one script on Redis
(``HISTORY_SINCE``), which returns the session's id and head and only the
items after the cached head:

- same session id and head: nothing changed anywhere (items are never
  rewritten, so a head names its whole chain); the cached chain is served;
- a head that descends from the cached one (a turn stored since, by any
  instance): only the new items come back, and are appended;
- anything else (a branch, a shorter chain, the session deleted and made
  again: ids are never reused) reads the whole chain afresh.

Items are shared with the callers that only read them (``shared``); others
get copies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from proxy.store import redis_codec as codec
from proxy.store.base import SessionRef, StoredItem
from proxy.store.history_cache import Held, HistoryCache

Run = Callable[..., Awaitable[Any]]


class RedisHistoryCache(HistoryCache):
    async def history(self, run: Run, session: SessionRef, *, shared: bool) -> list[StoredItem]:
        """The chain; ``run`` calls a store script by name with its arguments."""
        held = self.held(session)
        since = (str(held.session_id), str(held.head)) if held is not None else ("", "")
        out = await run("HISTORY_SINCE", session.tenant, session.key, *since)
        if not out or not out[1]:
            self.forget(session)
            return []
        session_id, head, reached = int(out[0]), int(out[1]), out[2] == b"1"
        if held is not None and held.session_id == session_id and held.head == head:
            return self.current(session, held, shared=shared)
        if held is None or held.session_id != session_id or not reached:
            held = None  # a full read: the walk reached the root
        parent = held.head if held is not None else None
        found, text = codec.chain_items(out, 3, session_id, parent)
        return self.keep(session, Held(session_id, head, tuple(found), text), held, shared=shared)
