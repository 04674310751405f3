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
from typing import Any

import orjson

from proxy.store.base import SessionRef, StoredItem
from proxy.store.history_cache import Held, HistoryCache
from proxy.store.rows import shared_role

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


class PostgresHistoryCache(HistoryCache):
    async def history(
        self, conn: Any, session: SessionRef, *, shared: bool = False
    ) -> list[StoredItem]:
        """The chain; ``shared``: the cached items themselves, which the caller only reads."""
        row = await conn.fetchrow(SESSION_HEAD, session.tenant, session.key)
        if row is None or row["head_item_id"] is None:
            self.forget(session)
            return []
        session_id, version, head = row["id"], row["version"], row["head_item_id"]
        held = self.held(session)
        if held is not None and held.session_id != session_id:
            held = None
        if held is not None and held.version == version:
            return self.current(session, held, shared=shared)
        rows = await conn.fetch(CHAIN_SINCE, head, held.head if held is not None else 0)
        fetched = tuple(map(_item, rows))
        if held is not None and fetched and fetched[0].parent_id != held.head:
            held = None  # a branch: the walk reached the root
        read = Held(session_id, head, fetched, sum(len(r[7]) for r in rows), version)
        return self.keep(session, read, held, shared=shared)


def _item(row: Any) -> StoredItem:
    """A row of CHAIN_SINCE (ITEM_COLUMNS' order is StoredItem's) as an item, by position."""
    message = orjson.loads(row[7])
    role = shared_role(row[5], message)
    return StoredItem(
        row[0], row[1], row[2], row[3], row[4], role, row[6], message, sys.intern(row[8]), row[9]
    )
