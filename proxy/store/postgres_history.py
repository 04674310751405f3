"""Each session's last read history, validated against the session's version before use.

A ``history: server`` request reads its session's whole chain before every
call; walking it from the head in PostgreSQL costs a recursive query and a
row per item, more with every turn. This per-instance cache keeps the chain
last read per session with the session's ``version`` (bumped by every write,
whatever instance makes it) and head. A read first fetches the session row:

- same session id and version: nothing changed anywhere; the cached chain
  is served (its items shared with the caller that only reads them: a
  ``history: server`` turn; others get copies);
- same session id, newer version: only the items after the cached head are
  fetched (the walk from the new head stops there), and appended; if the new
  head is not a descendant of the cached one (a branch), the walk reaches the
  root and the whole chain is replaced;
- another session id (deleted and made again) or no entry: a full read.

So a cached chain is never trusted without the store saying it is current,
and another instance's write is seen by the next read.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.store.base import SessionRef, StoredItem
from proxy.store.rows import copied, shared_role
from proxy.store.sized import SizedLRU

SESSION_HEAD = "SELECT id, version, head_item_id FROM sessions WHERE tenant = $1 AND key = $2"

ITEM_COLUMNS = (
    "items.id, items.session_id, items.parent_id, items.path_hash, items.content_hash,"
    " items.role, items.token_count, items.message_json, items.status, items.created_at"
)

# The chain from $1 (a head) back to, not including, $2 (the cached head; 0: none).
CHAIN_SINCE = f"""
    WITH RECURSIVE chain (id, parent_id, depth) AS (
        SELECT id, parent_id, 0 FROM items WHERE id = $1 AND id <> $2
        UNION ALL
        SELECT items.id, items.parent_id, chain.depth + 1 FROM items
            JOIN chain ON items.id = chain.parent_id
            WHERE items.id <> $2
    )
    SELECT {ITEM_COLUMNS} FROM chain JOIN items ON items.id = chain.id ORDER BY chain.depth DESC
"""


@dataclass(frozen=True)
class _Entry:
    session_id: int
    version: int
    head: int
    # Each item, its message parsed once (it was decoded again, and every item
    # copied, on every turn: ~4 us an item, 8 ms a turn of a 2,000-item chain).
    items: tuple[StoredItem, ...]
    size: int


# What an item costs held besides its message's JSON length (the dict and its
# strings are about the JSON's size; the StoredItem, its hash strings, its
# numbers): as the SQLite store's (proxy/store/sqlite_history.py).
ITEM_BYTES = 600


class HistoryCache:
    """Bounded by sessions and by the bytes held (JSON length plus ITEM_BYTES an item)."""

    def __init__(self, max_sessions: int = 1024, max_bytes: int = 64 * 2**20) -> None:
        self._entries: SizedLRU[tuple[str, str], _Entry] = SizedLRU(
            max_sessions, max_bytes, admission=True
        )

    async def history(
        self, conn: Any, session: SessionRef, *, shared: bool = False
    ) -> list[StoredItem]:
        """The chain; ``shared``: the cached items themselves, which the caller only reads."""
        key = (session.tenant, session.key)
        row = await conn.fetchrow(SESSION_HEAD, session.tenant, session.key)
        if row is None or row["head_item_id"] is None:
            self._entries.drop(key)
            return []
        session_id, version, head = row["id"], row["version"], row["head_item_id"]
        entry = self._entries.get(key)
        if entry is not None and entry.session_id != session_id:
            entry = None
        if entry is None or entry.version != version:
            since = entry.head if entry is not None else 0
            rows = await conn.fetch(CHAIN_SINCE, head, since)
            fetched = tuple(map(_item, rows))
            added = sum(len(r[7]) for r in rows) + ITEM_BYTES * len(rows)
            if entry is not None and (not fetched or fetched[0].parent_id == entry.head):
                # The cached chain, extended.
                entry = _Entry(session_id, version, head, entry.items + fetched, entry.size + added)
            else:
                # A full read (or a branch: the walk reached the root).
                entry = _Entry(session_id, version, head, fetched, added)
            self._entries.put(key, entry, entry.size)
        else:
            self._entries.touch(key)
        if shared:
            return list(entry.items)
        return copied(entry.items)

    def forget(self, session: SessionRef) -> None:
        self._entries.drop((session.tenant, session.key))


def _item(row: Any) -> StoredItem:
    """A row of CHAIN_SINCE (ITEM_COLUMNS' order is StoredItem's) as an item, by position."""
    message = orjson.loads(row[7])
    role = shared_role(row[5], message)
    return StoredItem(
        row[0], row[1], row[2], row[3], row[4], role, row[6], message, sys.intern(row[8]), row[9]
    )
