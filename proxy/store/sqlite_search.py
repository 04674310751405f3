"""The SQLite recall index: FTS5 (``porter unicode61``) ranked by ``bm25()``.

The table (``items_fts``, migration 4) holds each item's searchable text in
``body``, a token naming its session in ``scope`` (``s<session id>``), and
its chain position in ``pos``. A query matches ``scope`` and the terms in one
FTS5 expression, so the index itself confines it to the session; the join on
``sessions`` by tenant and key checks it again. ``bm25`` weighs ``scope`` 0.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from proxy.store.base import SessionRef
from proxy.store.search import SearchHit
from proxy.store.search_text import search_text

_INSERT = "INSERT INTO items_fts (rowid, scope, body, pos) VALUES (?, ?, ?, ?)"

_SEARCH = """
    SELECT f.rowid, f.pos, bm25(items_fts, 0.0, 1.0) AS rank, i.content_hash
    FROM sessions s
    JOIN items_fts f ON items_fts MATCH ('scope : s' || s.id || ' AND body : (' || ? || ')')
    JOIN items i ON i.id = f.rowid AND i.session_id = s.id
    WHERE s.tenant = ? AND s.key = ? AND f.pos < ?
    ORDER BY rank
    LIMIT ?
"""

# Far above any chain's length: "no ``before``".
_NO_LIMIT = 1 << 62


def index_items(
    conn: sqlite3.Connection, session_id: int, items: Sequence[tuple[int, int, Any]]
) -> None:
    """Index newly stored items in the transaction storing them: (item id, position, message)."""
    scope = f"s{session_id}"
    rows = []
    for item_id, position, message in items:
        text = search_text(message)
        if text:
            rows.append((item_id, scope, text, position))
    if rows:
        conn.executemany(_INSERT, rows)


def match_expression(terms: Sequence[str]) -> str:
    """The terms as an FTS5 OR expression, each quoted (so no term is read as syntax)."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


class SqliteRecallIndex:
    """:class:`~proxy.store.search.RecallIndex` on a SQLite store's read connection."""

    def __init__(self, fetch: Callable[[str, tuple[Any, ...]], Any]) -> None:
        # SqliteStore._fetch: a query on the store's aiosqlite connection.
        self._fetch = fetch

    async def search(
        self,
        session: SessionRef,
        terms: Sequence[str],
        *,
        limit: int,
        before: int | None = None,
    ) -> list[SearchHit]:
        if not terms or limit <= 0:
            return []
        params = (
            match_expression(terms),
            session.tenant,
            session.key,
            _NO_LIMIT if before is None else before,
            limit,
        )
        rows = await self._fetch(_SEARCH, params)
        # bm25() is lower-is-better; the protocol's score is higher-is-better.
        return [SearchHit(int(r[0]), int(r[1]), str(r[3]), -float(r[2])) for r in rows]
