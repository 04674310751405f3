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
from typing import Any, NamedTuple

from proxy.store import redis_codec as codec
from proxy.store.base import SessionRef, StoredItem
from proxy.store.rows import copied
from proxy.store.sized import SizedLRU

# What an item costs held besides its JSON's length: as the SQLite store's
# (proxy/store/sqlite_history.py); the JSON here also holds its columns.
ITEM_BYTES = 600


class _Entry(NamedTuple):
    session_id: int
    head: int
    items: tuple[StoredItem, ...]
    size: int


Run = Callable[..., Awaitable[Any]]


class RedisHistoryCache:
    """Bounded by sessions and by the bytes held (JSON length plus ITEM_BYTES an item)."""

    def __init__(self, max_sessions: int = 1024, max_bytes: int = 64 * 2**20) -> None:
        self._entries: SizedLRU[tuple[str, str], _Entry] = SizedLRU(
            max_sessions, max_bytes, admission=True
        )

    def __len__(self) -> int:
        return len(self._entries)

    async def history(self, run: Run, session: SessionRef, *, shared: bool) -> list[StoredItem]:
        """The chain; ``run`` calls a store script by name with its arguments."""
        key = (session.tenant, session.key)
        entry = self._entries.get(key)
        held = (str(entry.session_id), str(entry.head)) if entry is not None else ("", "")
        out = await run("HISTORY_SINCE", session.tenant, session.key, *held)
        if not out or not out[1]:
            self._entries.drop(key)
            return []
        session_id, head, reached = int(out[0]), int(out[1]), out[2] == b"1"
        if entry is not None and entry.session_id == session_id and entry.head == head:
            self._entries.touch(key)
        else:
            extend = entry is not None and entry.session_id == session_id and reached
            parent = entry.head if extend and entry is not None else None
            found, text = codec.chain_items(out, 3, session_id, parent)
            new, added = tuple(found), text + ITEM_BYTES * len(found)
            if extend and entry is not None:
                entry = _Entry(session_id, head, entry.items + new, entry.size + added)
            else:
                entry = _Entry(session_id, head, new, added)
            self._entries.put(key, entry, entry.size)
        if shared:
            return list(entry.items)
        return copied(entry.items)

    def forget(self, session: SessionRef) -> None:
        self._entries.drop((session.tenant, session.key))
