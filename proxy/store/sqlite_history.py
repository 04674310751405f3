"""Each session's last read history (SQLite), checked against the session row before use.

A ``history: server`` request reads its session's whole chain before every
call; walking it from the head costs a recursive query, a row and a JSON
parse per item, more with every turn. This per-instance cache keeps the
chain last read per session. Every read is still one statement on the
store, which returns the session's id and head and, in the same walk, only
the items after the cached head:

- same session id and head: nothing changed anywhere (items are never
  rewritten, so a head names its whole chain); the cached chain is served;
- same session id, another head that descends from the cached one (a turn
  stored since, by this instance or another sharing the file): the walk
  stops at the cached head and only the new items are parsed and appended;
- any other head (a branch, a shorter history), another session id (deleted
  and made again: ids are never reused) or no entry: the walk reaches the
  root and the chain is replaced.

So a cached chain is never trusted without the store saying it is current,
and another process's write is seen by the next read. Items are shared with
the callers (their messages are parsed once): callers must not change them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from operator import itemgetter
from typing import Any

import orjson

from proxy.store.base import SessionRef, StoredItem
from proxy.store.history_cache import Held, HistoryCache
from proxy.store.rows import shared_role

# The stored columns as they are (hashes as their 16 bytes or text, ``incomplete``
# 0 or 1): turning them into strings in SQL (hex(), CASE) took about a third of a
# long chain's read; Python does it per row in C (bytes.hex).
RAW_COLUMNS = """items.id, items.session_id, items.parent_id, items.path_hash,
    items.content_hash, items.kind, items.token_count, items.incomplete,
    items.message_json, items.created_at"""

# The session (id, head) and the chain from its head back to, not including,
# the cached head (?3; 0: none), in one statement: always at least one row.
# No ORDER BY: sorting every row with its JSON took another third. The walk
# yields the chain head first (depth 0, 1, ...); the reader checks that order
# (``_oldest_first``) and sorts only if it ever differs.
HISTORY_SINCE = f"""
    WITH RECURSIVE s (sid, head) AS (
        SELECT id, head_item_id FROM sessions WHERE tenant = ? AND key = ?
    ),
    chain (id, depth) AS (
        SELECT head, 0 FROM s WHERE head IS NOT NULL AND head <> ?3
        UNION ALL
        SELECT items.parent_id, chain.depth + 1 FROM items JOIN chain ON items.id = chain.id
            WHERE items.parent_id IS NOT NULL AND items.parent_id <> ?3
    )
    SELECT s.sid, s.head, {RAW_COLUMNS}, chain.depth
    FROM s LEFT JOIN chain LEFT JOIN items ON items.id = chain.id
"""
DEPTH = 12
STATUS = ("complete", "incomplete")


class SqliteHistoryCache(HistoryCache):
    async def history(
        self,
        fetch: Callable[[str, tuple[Any, ...]], Awaitable[list[Any]]],
        session: SessionRef,
        *,
        shared: bool = False,
    ) -> list[StoredItem]:
        """The chain; ``shared``: the cached items themselves, which the caller only reads."""
        held = self.held(session)
        since = held.head if held is not None else 0
        rows = await fetch(HISTORY_SINCE, (session.tenant, session.key, since))
        if not rows or rows[0][1] is None:
            self.forget(session)
            return []
        session_id, head = rows[0][0], rows[0][1]
        if held is not None and held.session_id == session_id and held.head == head:
            return self.current(session, held, shared=shared)
        chain = _oldest_first(rows)
        new = tuple(map(_item, chain))
        read = Held(session_id, head, new, sum(len(row[10]) for row in chain))
        if (
            held is None
            or held.session_id != session_id
            or not new
            or new[0].parent_id != held.head
        ):
            held = None  # a full read: the walk reached the root
        return self.keep(session, read, held, shared=shared)


def _oldest_first(rows: list[Any]) -> list[Any]:
    """HISTORY_SINCE's item rows, root first (they come head first, by depth)."""
    chain = [row for row in rows if row[2] is not None]
    if [row[DEPTH] for row in chain] != list(range(len(chain))):
        chain.sort(key=itemgetter(DEPTH))  # never seen: SQLite walks in order
    chain.reverse()
    return chain


def _item(row: Any) -> StoredItem:
    """A row of HISTORY_SINCE as an item.

    By position, not through a dict of its columns: on a cache miss this runs
    for every item of the chain, and building the dict and the keyword call
    took twice what parsing the JSON does.
    """
    message = orjson.loads(row[10])
    role = shared_role(row[7], message)
    path, content = row[5], row[6]
    return StoredItem(
        row[2],
        row[3],
        row[4],
        path.hex() if type(path) is bytes else path,
        content.hex() if type(content) is bytes else content,
        role,
        row[8],
        message,
        STATUS[row[9]],
        row[11],
    )
