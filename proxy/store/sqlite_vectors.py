"""The SQLite vector index: ``item_vectors`` (migration 6), one row per embedded item.

Written through the store's writer (group-committed with the exchanges), read
on its read connection. ``seq`` (AUTOINCREMENT) is the cursor: SQLite has one
writer at a time, so rows become visible in ``seq`` order and a reader that
saw up to ``c`` has missed nothing below it.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from proxy.store.base import SessionRef
from proxy.store.sqlite_items import hex_sql
from proxy.store.vectors import ItemVector, StoredVectors

# The item must be the session's: a vector for anything else is ignored.
_INSERT = """
    INSERT OR IGNORE INTO item_vectors (item_id, session_id, pos, vector)
    SELECT i.id, i.session_id, ?, ? FROM items i
    WHERE i.id = ? AND i.session_id = (SELECT id FROM sessions WHERE tenant = ? AND key = ?)
"""

# One statement (one trip to the read thread): the session's id on every row,
# one row of NULLs when it has no new vectors, none when there is no session.
_READ = f"""
    SELECT s.id, v.seq, v.item_id, v.pos, {hex_sql("i.content_hash")}, v.vector
    FROM sessions s
    LEFT JOIN item_vectors v ON v.session_id = s.id AND v.seq > ?
    LEFT JOIN items i ON i.id = v.item_id
    WHERE s.tenant = ? AND s.key = ?
    ORDER BY v.seq
"""


def _put(session: SessionRef, vectors: Sequence[ItemVector], conn: sqlite3.Connection) -> None:
    conn.executemany(
        _INSERT,
        [(v.position, v.vector, v.item_id, session.tenant, session.key) for v in vectors],
    )


class SqliteVectorIndex:
    """:class:`~proxy.store.vectors.VectorIndex` on a SQLite store."""

    def __init__(
        self,
        fetch: Callable[[str, tuple[Any, ...]], Awaitable[list[Any]]],
        write: Callable[[Callable[[sqlite3.Connection], None]], Awaitable[None]],
    ) -> None:
        # SqliteStore.fetch (a read) and SqliteStore.write (a job for its writer).
        self._fetch = fetch
        self._write = write

    async def put_vectors(self, session: SessionRef, vectors: Sequence[ItemVector]) -> None:
        if vectors:
            await self._write(functools.partial(_put, session, list(vectors)))

    async def vectors(self, session: SessionRef, *, after: int = 0) -> StoredVectors:
        rows = await self._fetch(_READ, (after, session.tenant, session.key))
        if not rows:
            return StoredVectors(None, [], after)
        found = [r for r in rows if r[1] is not None]
        return StoredVectors(
            int(rows[0][0]),
            [ItemVector(int(r[2]), int(r[3]), str(r[4]), bytes(r[5])) for r in found],
            int(found[-1][1]) if found else after,
        )
