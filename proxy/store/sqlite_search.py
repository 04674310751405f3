"""The SQLite recall index: FTS5 (``porter unicode61``) ranked by ``bm25()``.

The table (``items_fts``, migration 5) indexes each item's searchable text
(``body``), a token naming its session in ``scope`` (``s<session id>``), and
its chain position in ``pos``. Since migration 7 it keeps no copy of them:
it is an external-content table over the view ``items_fts_source``, which
computes them from ``items`` (the text from ``message_json``, in SQL), so a
query reads ``pos`` from ``items``. A search is two queries on the read connection:

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

# Items with no searchable text are not indexed (as migration 5 left them out).
_INDEX = """
    INSERT INTO items_fts (rowid, scope, body, pos)
    SELECT id, scope, body, pos FROM items_fts_source WHERE id IN ({marks}) AND body != ''
"""
_CHUNK = 500

_SEARCH = """
    SELECT f.rowid, i.pos, bm25(items_fts, 0.0, 1.0) AS rank, i.content_hash
    FROM items_fts f JOIN items i ON i.id = f.rowid AND i.session_id = ?
    WHERE items_fts MATCH ? AND i.pos < ?
    ORDER BY rank
    LIMIT ?
"""

# A term in more of the session's items than this (and than COMMON_MIN) is
# left out when rarer terms are there: its BM25 weight is near nothing, but
# ranking every item it matches is most of a query's time (bench/recall.py).
COMMON_SHARE = 0.05
COMMON_MIN = 50


@functools.lru_cache(maxsize=64)
def _search_sql(terms: int) -> str:
    """The whole search as one statement (one trip to the read thread).

    The session's id by tenant and key; how many of its items hold each term
    (counting needs no ranking, so it is cheap); the informative terms
    (:func:`informative`, in SQL); then the ranked match of ``scope`` and
    those terms, confined to the session by the index and by ``items``.
    """
    values = ", ".join("(?)" for _ in range(terms))
    return f"""
    WITH s AS (SELECT id, 'scope : s' || id AS scope FROM sessions WHERE tenant = ? AND key = ?),
    t (term) AS (VALUES {values}),
    n AS (SELECT (SELECT count(*) FROM items_fts WHERE items_fts MATCH s.scope) AS items FROM s),
    c AS (
        SELECT t.term, (SELECT count(*) FROM items_fts
            WHERE items_fts MATCH s.scope || ' AND body : ' || t.term) AS df
        FROM t, s
    ),
    r AS (SELECT term, df, row_number() OVER (ORDER BY df, term) AS k FROM c WHERE df > 0),
    cap AS (SELECT max(?, ? * n.items) AS most FROM n),
    chosen AS (
        SELECT group_concat(term, ' OR ') AS expr FROM r, cap
        WHERE r.df <= cap.most
            OR (r.k <= 2 AND NOT EXISTS (SELECT 1 FROM r AS rare WHERE rare.df <= cap.most))
    )
    SELECT f.rowid, i.pos, bm25(items_fts, 0.0, 1.0) AS rank, i.content_hash
    FROM items_fts f JOIN items i ON i.id = f.rowid
    -- No informative term (or no session): a scope no item has, so nothing matches.
    WHERE items_fts MATCH coalesce((
            SELECT s.scope || ' AND body : (' || chosen.expr || ')' FROM s, chosen
            WHERE chosen.expr IS NOT NULL), 'scope : none')
        AND i.session_id = (SELECT id FROM s) AND i.pos < ?
    ORDER BY rank
    LIMIT ?
    """


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


def index_items(conn: sqlite3.Connection, item_ids: Sequence[int]) -> None:
    """Index newly stored items in the transaction storing them.

    Their text comes from the view the index reads (migration 7), so the
    delete trigger later removes exactly what was indexed here.
    """
    for start in range(0, len(item_ids), _CHUNK):
        chunk = item_ids[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        conn.execute(_INDEX.format(marks=marks), tuple(chunk))


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
        bound = _NO_LIMIT if before is None else before
        params = (session.tenant, session.key, *quoted, COMMON_MIN, COMMON_SHARE, bound, limit)
        rows = await self._fetch(_search_sql(len(quoted)), params)
        # bm25() is lower-is-better; the protocol's score is higher-is-better.
        return [SearchHit(int(r[0]), int(r[1]), str(r[3]), -float(r[2])) for r in rows]
