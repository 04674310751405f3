"""The SQLite recall index: FTS5 (``porter unicode61``) ranked by ``bm25()``.

The table (``items_fts``, migration 4) holds each item's searchable text in
``body``, a token naming its session in ``scope`` (``s<session id>``), and
its chain position in ``pos``. A search is two queries on the read connection:

1. the session's id (by tenant and key) and, in the same statement, how many
   of its items hold each term (cheap: counting needs no ranking);
2. the ranked match of ``scope`` and the informative terms in one FTS5
   expression, so the index itself confines it to the session (the join on
   ``items`` by session id checks it again). ``bm25`` weighs ``scope`` 0.

Ranking is what costs: ``bm25()`` runs once per matching row, so a term
found in most of a long session's items (and weighing nearly nothing) is
left out when rarer ones are there (:func:`informative`).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from proxy.store.base import SessionRef
from proxy.store.search import SearchHit
from proxy.store.search_text import search_text

_INSERT = "INSERT INTO items_fts (rowid, scope, body, pos) VALUES (?, ?, ?, ?)"

_SEARCH = """
    SELECT f.rowid, f.pos, bm25(items_fts, 0.0, 1.0) AS rank, i.content_hash
    FROM items_fts f JOIN items i ON i.id = f.rowid AND i.session_id = ?
    WHERE items_fts MATCH ? AND f.pos < ?
    ORDER BY rank
    LIMIT ?
"""

# A term in more of the session's items than this (and than COMMON_MIN) is
# left out when rarer terms are there: its BM25 weight is near nothing, but
# ranking every item it matches is most of a query's time (bench/recall.py).
COMMON_SHARE = 0.05
COMMON_MIN = 50


@functools.lru_cache(maxsize=64)
def _frequencies_sql(terms: int) -> str:
    """The session's id, its item count, and how many of its items hold each term: one query."""
    each = "".join(
        ", (SELECT count(*) FROM items_fts WHERE items_fts MATCH s.scope || ' AND body : ' || ?)"
        for _ in range(terms)
    )
    return (
        "WITH s AS (SELECT id, 'scope : s' || id AS scope FROM sessions"
        " WHERE tenant = ? AND key = ?)"
        f" SELECT s.id, (SELECT count(*) FROM items_fts WHERE items_fts MATCH s.scope){each}"
        " FROM s"
    )


def informative(terms: Sequence[str], counts: Sequence[int], items: int) -> list[str]:
    """The terms worth ranking by: found in the session, and not in most of it."""
    found = [(n, t) for t, n in zip(terms, counts, strict=True) if n > 0]
    cap = max(COMMON_MIN, COMMON_SHARE * items)
    rare = [t for n, t in found if n <= cap]
    if rare:
        return rare
    return [t for _, t in sorted(found)[:2]]


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


def _quote(term: str) -> str:
    """A term as an FTS5 string (so no term is read as syntax)."""
    return '"' + term.replace('"', '""') + '"'


def match_expression(terms: Sequence[str]) -> str:
    """The terms as an FTS5 OR expression, each quoted."""
    return " OR ".join(_quote(t) for t in terms)


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
        quoted = [_quote(t) for t in terms]
        rows = await self._fetch(
            _frequencies_sql(len(quoted)), (session.tenant, session.key, *quoted)
        )
        if not rows:
            return []
        session_id, items, *counts = (int(v) for v in rows[0])
        chosen = informative(quoted, counts, items)
        if not chosen:
            return []
        match = f"scope : s{session_id} AND body : ({' OR '.join(chosen)})"
        bound = _NO_LIMIT if before is None else before
        rows = await self._fetch(_SEARCH, (session_id, match, bound, limit))
        # bm25() is lower-is-better; the protocol's score is higher-is-better.
        return [SearchHit(int(r[0]), int(r[1]), str(r[3]), -float(r[2])) for r in rows]
