"""Recall on the PostgreSQL store: each item's ``tsvector`` (migration 3), BM25 in the proxy.

The vector is written in the same statement that stores the item
(proxy/store/postgres_jobs.py), under the ``ctx_english`` configuration:
English snowball stems, as SQLite's porter, and no stopword list (the recall
step drops its own). The database is asked only for what its indexes answer
(proxy/store/bm25_index.py ranks): the session's items stored since this process
last counted them (``items_session_id``, migration 5) and the ids of the
session's items matching each term (the GIN index ``items_search``); then
the positions, token counts and content hashes of the candidates this process
has not read before, and the messages of those that may rank (the words they
repeat, counted as every backend counts them: the ``tsvector``'s stems are
English snowball's, not Porter's). Each term
is matched as ``plainto_tsquery`` makes it (its words, stemmed, all of them).
A term's items are found by the GIN index alone, then checked for the
session (``session_id + 0``: the planner does not get to scan the session's
items and test each one, which it chose on a table just filled, before
statistics: 75 ms p50 at 5,000 stored turns, against 9.5). The cost is the
term's matches in every session: with many large sessions, a common word is
worth a per-session lexeme, as the SQLite index has (not done yet).

It used to rank in SQL with ``ts_rank``: every matching item's ``tsvector``
read, and the session's items scanned once per term for its statistics
(203 ms p50 at 5,000 stored turns, bench/recall.py).

Ids are an identity column: they grow, but a transaction may commit an id
lower than one already counted; such an item is matched, only left out of
the totals (which only weigh the terms) until the process restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from proxy.store.bm25_index import Bm25Index

_MATCHES = """
    WITH s AS (SELECT id FROM sessions WHERE tenant = $1 AND key = $2),
    added AS (
        SELECT count(*) AS items, coalesce(sum(i.token_count), 0) AS tokens, max(i.id) AS top
        FROM items i
        -- Only items with words count, as the other indexes count them.
        WHERE i.session_id = (SELECT id FROM s) AND i.id > $3 AND i.search <> ''::tsvector
    )
    SELECT -1 AS k, s.id::text AS ids, added.items, added.tokens, added.top FROM s, added
    UNION ALL
    SELECT t.k::int - 1, (
        SELECT string_agg(i.id::text, ',') FROM items i
        WHERE i.session_id + 0 = s.id AND i.search @@ plainto_tsquery('ctx_english', t.term)
    ), NULL, NULL, NULL
    FROM s, unnest($4::text[]) WITH ORDINALITY AS t (term, k)
"""

_ROWS = """
    SELECT id, session_id, position, token_count, content_hash
    FROM items WHERE id = ANY($1::bigint[])
"""

_TEXTS = "SELECT id, message_json FROM items WHERE id = ANY($1::bigint[])"

Fetch = Callable[..., Coroutine[Any, Any, list[Any]]]


class PostgresRecallIndex(Bm25Index):
    """:class:`~proxy.store.search.RecallIndex` on a PostgreSQL store's pool."""

    def __init__(self, fetch: Fetch) -> None:
        super().__init__()
        # PostgresStore._fetch: one query on a pooled connection.
        self._fetch = fetch

    def _words(self, term: str) -> Sequence[str]:
        return (term.lower(),)

    async def _matches(self, key: tuple[str, str], top: int, terms: Sequence[str]) -> Sequence[Any]:
        rows = await self._fetch(_MATCHES, *key, top, list(terms))
        # A term no item holds is no row (as the SQLite statement's).
        return [r for r in rows if r[0] == -1 or r[1]]

    async def _rows(self, ids: Sequence[int]) -> Sequence[Any]:
        return await self._fetch(_ROWS, list(ids))

    async def _texts(self, ids: Sequence[int]) -> Sequence[Any]:
        return await self._fetch(_TEXTS, list(ids))
