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
from typing import Any, NamedTuple

import orjson

from proxy.store.base import SessionRef, StoredItem
from proxy.store.rows import shared_role
from proxy.store.sized import SizedLRU

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

# What an item costs held, besides its message's JSON length (the dict and its
# strings are about the JSON's size; the StoredItem, its two hash strings, its
# numbers): ~596 bytes measured with tracemalloc on CPython 3.11 (~697 before
# StoredItem had slots and role and status were interned).
ITEM_BYTES = 600


class _Entry(NamedTuple):
    session_id: int
    head: int
    items: tuple[StoredItem, ...]
    size: int


def item_bytes(item: StoredItem, json_length: int) -> int:
    return json_length + ITEM_BYTES


class SqliteHistoryCache:
    """Bounded by sessions and by the bytes held (estimated: :func:`item_bytes`)."""

    def __init__(self, max_sessions: int = 1024, max_bytes: int = 64 * 2**20) -> None:
        self._entries: SizedLRU[tuple[str, str], _Entry] = SizedLRU(
            max_sessions, max_bytes, admission=True
        )

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        return self._entries.size

    @property
    def max_bytes(self) -> int:
        return self._entries.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._entries.max_bytes = value

    async def history(
        self,
        fetch: Callable[[str, tuple[Any, ...]], Awaitable[list[Any]]],
        session: SessionRef,
    ) -> list[StoredItem]:
        key = (session.tenant, session.key)
        entry = self._entries.get(key)
        since = entry.head if entry is not None else 0
        rows = await fetch(HISTORY_SINCE, (session.tenant, session.key, since))
        if not rows or rows[0][1] is None:
            self._entries.drop(key)
            return []
        session_id, head = rows[0][0], rows[0][1]
        if entry is not None and entry.session_id == session_id and entry.head == head:
            self._entries.touch(key)
            return list(entry.items)
        fetched = [_item(row) for row in _oldest_first(rows)]
        added = sum(item_bytes(item, n) for item, n in fetched)
        new = tuple(item for item, _ in fetched)
        if (
            entry is not None
            and entry.session_id == session_id
            and new
            and new[0].parent_id == entry.head
        ):
            entry = _Entry(session_id, head, entry.items + new, entry.size + added)
        else:
            entry = _Entry(session_id, head, new, added)
        self._entries.put(key, entry, entry.size)
        return list(entry.items)

    def forget(self, session: SessionRef) -> None:
        self._entries.drop((session.tenant, session.key))


def _oldest_first(rows: list[Any]) -> list[Any]:
    """HISTORY_SINCE's item rows, root first (they come head first, by depth)."""
    chain = [row for row in rows if row[2] is not None]
    if [row[DEPTH] for row in chain] != list(range(len(chain))):
        chain.sort(key=itemgetter(DEPTH))  # never seen: SQLite walks in order
    chain.reverse()
    return chain


def _item(row: Any) -> tuple[StoredItem, int]:
    """A row of HISTORY_SINCE as an item, and its JSON's length.

    By position, not through a dict of its columns: on a cache miss this runs
    for every item of the chain, and building the dict and the keyword call
    took twice what parsing the JSON does.
    """
    data = row[10]
    message = orjson.loads(data)
    role = shared_role(row[7], message)
    path, content = row[5], row[6]
    item = StoredItem(
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
    return item, len(data)
