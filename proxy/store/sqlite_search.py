"""The SQLite recall index: FTS5 (``porter unicode61``) for matching, BM25 in Python.

The table (``items_fts``) indexes each item's searchable text with every word
in its session's own namespace, ``s<session id>_<word>`` (migration 8), and
the token ``s<session id>_`` in every indexed item of the session. It keeps
no copy of the text: it is an external-content table over the view
``items_fts_source``, which computes the prefixed text from ``items`` (the
text from ``message_json``, in SQL); it holds rowids only (``detail =
none``: no positions, no lengths), and positions are read from ``items.pos``.
A term's doclist is the session's own, so matching it reads only the
session's items that hold it (before migration 8 it was every session's,
merged on each query with the session's ``scope`` doclist: most of a query's
time at 5,000 stored turns). A search (ranked in the proxy:
proxy/store/bm25_index.py) is one statement for the session's id, what its index
gained since this process last counted (rowids only grow: AUTOINCREMENT)
and the rowids of the session's items holding each term, the index alone,
no row read; then, for the candidates this process has not read before, one
for their positions, token counts and content hashes, and one for the
messages of those that may rank (the words they repeat: the index has no
term frequencies).

A query term is looked up as the words the tokenizer makes of it (``_`` and
every separator split it, as they split the indexed text): the index has no
positions, so no phrases.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any

from proxy.store.bm25_index import Bm25Index
from proxy.store.sqlite_items import hex_sql

# An item without searchable text has a NULL body in the view: its row adds nothing.
_INDEX = """
    INSERT INTO items_fts (rowid, body) SELECT id, body FROM items_fts_source WHERE id IN ({marks})
"""
_CHUNK = 500


@functools.lru_cache(maxsize=64)
def _match_sql(terms: int) -> str:
    """Statement 1: the session, what its index gained since rowid ``?``, each term's rowids.

    Parameters: tenant, key, the rowid the session's totals go up to, then
    the terms (:func:`words`). Row ``k = -1``: the session id, items and
    tokens added after that rowid, the highest rowid now (NULL: none added);
    then a row (``k``, the rowids of the session's items holding term ``k``,
    comma-separated, NULL if none) per term. One statement, so one snapshot.
    The items added are read newest first, so the scan stops at that rowid.
    """
    values = ", ".join("(?, ?)" for _ in range(terms))
    rowids = f"""
    UNION ALL
    SELECT t.column1, (
        SELECT group_concat(rowid) FROM items_fts
        WHERE items_fts MATCH '"' || s.prefix || t.column2 || '"'
    ), NULL, NULL, NULL
    FROM s, (VALUES {values}) AS t
    """
    return f"""
    WITH s AS (
        SELECT id, 's' || id || '_' AS prefix, '"s' || id || '_"' AS scope
        FROM sessions WHERE tenant = ? AND key = ?
    ),
    added AS (
        SELECT count(*) AS items, coalesce(sum(i.token_count), 0) AS tokens, max(f.id) AS top
        FROM (
            SELECT rowid AS id FROM items_fts
            WHERE items_fts MATCH coalesce((SELECT scope FROM s), '""') AND rowid > ?
            ORDER BY rowid DESC
        ) AS f CROSS JOIN items i ON i.id = f.id
    )
    SELECT -1, s.id, added.items, added.tokens, added.top FROM s, added
    {rowids if terms else ""}"""


@functools.lru_cache(maxsize=64)
def _detail_sql(rows: int) -> str:
    """Statement 2: position, token count and content hash of the candidates (rowids)."""
    marks = ", ".join("?" for _ in range(rows))
    return f"""
    SELECT id, session_id, pos, token_count, {hex_sql("content_hash")}
    FROM items WHERE id IN ({marks})
    """


@functools.lru_cache(maxsize=64)
def _text_sql(rows: int) -> str:
    """Statement 3: the messages of the candidates that may rank (their repeated words)."""
    return f"SELECT id, message_json FROM items WHERE id IN ({', '.join('?' * rows)})"


def index_items(conn: sqlite3.Connection, item_ids: Sequence[int]) -> None:
    """Index newly stored items in the transaction storing them.

    Their text comes from the view the index reads (migration 7), so the
    delete trigger later removes exactly what was indexed here.
    """
    for start in range(0, len(item_ids), _CHUNK):
        chunk = item_ids[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        conn.execute(_INDEX.format(marks=marks), tuple(chunk))


_ASCII_WORD = re.compile(r"[a-z0-9]+")
# unicode61 as the index has it (``_`` a token character), without porter: the
# words it makes of a non-ASCII term. One in-memory table, behind a lock.
_PROBE = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
_PROBE.execute(
    "CREATE VIRTUAL TABLE probe USING fts5 (body, tokenize = 'unicode61 tokenchars ''_''')"
)
_PROBE.execute("CREATE VIRTUAL TABLE probe_words USING fts5vocab (probe, instance)")
_PROBE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8192)
def words(term: str) -> tuple[str, ...]:
    """The index's words for a query term, each one token of the indexed text.

    The view writes a space for ``_`` and for each separator, so they split a
    term here too; a letter unicode61 does not know splits it as in the text.
    Letters and digits only: no FTS5 syntax can come through.
    """
    term = term.lower().replace("_", " ")
    if term.isascii():
        return tuple(_ASCII_WORD.findall(term))
    with _PROBE_LOCK:
        _PROBE.execute("BEGIN")
        try:
            _PROBE.execute("INSERT INTO probe (body) VALUES (?)", (term,))
            found = _PROBE.execute("SELECT term FROM probe_words ORDER BY offset").fetchall()
        finally:
            _PROBE.execute("ROLLBACK")
    return tuple(str(w) for (w,) in found)


class SqliteRecallIndex(Bm25Index):
    """:class:`~proxy.store.search.RecallIndex` on a SQLite store's read connection."""

    def __init__(self, fetch: Callable[[str, tuple[Any, ...]], Any]) -> None:
        super().__init__()
        # SqliteStore.fetch_short: a short read on the event loop's thread.
        self._fetch = fetch

    def _words(self, term: str) -> Sequence[str]:
        return words(term)

    async def _matches(self, key: tuple[str, str], top: int, terms: Sequence[str]) -> Sequence[Any]:
        pairs = [x for k, t in enumerate(terms) for x in (k, t)]
        rows: Sequence[Any] = await self._fetch(_match_sql(len(terms)), (*key, top, *pairs))
        return rows

    async def _rows(self, ids: Sequence[int]) -> Sequence[Any]:
        rows: Sequence[Any] = await self._fetch(_detail_sql(len(ids)), tuple(ids))
        return rows

    async def _texts(self, ids: Sequence[int]) -> Sequence[Any]:
        rows: Sequence[Any] = await self._fetch(_text_sql(len(ids)), tuple(ids))
        return rows
