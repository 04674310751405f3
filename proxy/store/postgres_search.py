"""Recall on the PostgreSQL store: each item's ``tsvector`` (migration 3), ranked BM25-like.

The vector is written in the same statement that stores the item
(proxy/store/postgres_jobs.py), under the ``ctx_english`` configuration:
English snowball stems, as SQLite's porter, and no stopword list (the recall
step drops its own). ``ts_rank`` knows nothing of how rare a term is, so each
matched term's rank is weighted by its BM25 idf within the session, and
normalised by the item's length (``ts_rank``'s normalisation 1), which gives
the contract's ordering: rarer terms and more occurrences higher, long items lower.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from proxy.store.base import SessionRef
from proxy.store.search import SearchHit

# One statement: the session, each term's query and its document frequency in the
# session (a GIN index lookup), then the matching items ranked by the idf-weighted sum.
# The statistics are MATERIALIZED: inlined, PostgreSQL evaluated each term's count
# once per matching item (minutes per query at 5,000 stored turns, bench/recall.py).
_SEARCH = """
    WITH s AS (SELECT id FROM sessions WHERE tenant = $1 AND key = $2),
    q AS (
        SELECT plainto_tsquery('ctx_english', t) AS tq
        FROM unnest($3::text[]) AS t
    ),
    terms AS (SELECT DISTINCT tq FROM q WHERE numnode(tq) > 0),
    n AS MATERIALIZED (
        SELECT count(*)::float8 AS items FROM items WHERE session_id = (SELECT id FROM s)
    ),
    df AS MATERIALIZED (
        SELECT terms.tq, (
            SELECT count(*) FROM items i
            WHERE i.session_id = (SELECT id FROM s) AND i.search @@ terms.tq
        )::float8 AS df
        FROM terms
    ),
    w AS MATERIALIZED (
        SELECT tq, ln(1 + (n.items - df + 0.5) / (df + 0.5)) AS idf FROM df, n WHERE df > 0
    )
    SELECT i.id, i.position, i.content_hash,
        sum(w.idf * ts_rank(i.search, w.tq, 1)) AS score
    FROM items i JOIN w ON i.search @@ w.tq
    WHERE i.session_id = (SELECT id FROM s) AND ($4::int IS NULL OR i.position < $4)
    GROUP BY i.id, i.position, i.content_hash
    ORDER BY score DESC, i.id DESC
    LIMIT $5
"""

Fetch = Callable[..., Coroutine[Any, Any, list[Any]]]


class PostgresRecallIndex:
    """:class:`~proxy.store.search.RecallIndex` on a PostgreSQL store's pool."""

    def __init__(self, fetch: Fetch) -> None:
        # PostgresStore._fetch: one query on a pooled connection.
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
        rows = await self._fetch(_SEARCH, session.tenant, session.key, list(terms), before, limit)
        return [
            SearchHit(int(r["id"]), int(r["position"]), str(r["content_hash"]), float(r["score"]))
            for r in rows
        ]
