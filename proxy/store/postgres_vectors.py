"""The PostgreSQL vector index: ``item_vectors`` (migration 4), one row per embedded item.

A write locks its session's row (``FOR NO KEY UPDATE``: it does not block
the foreign-key checks of items being stored) before the rows take their
``seq``, and holds it to commit, so one session's vectors become visible in
``seq`` order: a reader whose cursor is ``c`` has missed nothing below it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from proxy.store.base import SessionRef
from proxy.store.vectors import ItemVector, StoredVectors

_T = TypeVar("_T")

_LOCK = "SELECT id FROM sessions WHERE tenant = $1 AND key = $2 FOR NO KEY UPDATE"

# Only the session's own items; an item that has a vector keeps it.
_INSERT = """
    INSERT INTO item_vectors (item_id, session_id, position, vector)
    SELECT i.id, i.session_id, v.position, v.vector
    FROM unnest($2::bigint[], $3::int[], $4::bytea[]) WITH ORDINALITY
        AS v (item_id, position, vector, n)
    JOIN items i ON i.id = v.item_id AND i.session_id = $1
    ORDER BY v.n
    ON CONFLICT (item_id) DO NOTHING
"""

# The session's id on every row; one row of NULLs when it has no new vectors.
_READ = """
    SELECT s.id AS session_id, v.seq, v.item_id, v.position, i.content_hash, v.vector
    FROM sessions s
    LEFT JOIN item_vectors v ON v.session_id = s.id AND v.seq > $3
    LEFT JOIN items i ON i.id = v.item_id
    WHERE s.tenant = $1 AND s.key = $2
    ORDER BY v.seq
"""


class PostgresVectorIndex:
    """:class:`~proxy.store.vectors.VectorIndex` on a PostgreSQL store's pool."""

    def __init__(
        self,
        fetch: Callable[..., Awaitable[list[Any]]],
        transaction: Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]],
    ) -> None:
        # PostgresStore._fetch and PostgresStore._transaction.
        self._fetch = fetch
        self._transaction = transaction

    async def put_vectors(self, session: SessionRef, vectors: Sequence[ItemVector]) -> None:
        if not vectors:
            return
        rows = list(vectors)

        async def job(conn: Any) -> None:
            session_id = await conn.fetchval(_LOCK, session.tenant, session.key)
            if session_id is None:
                return
            await conn.execute(
                _INSERT,
                session_id,
                [v.item_id for v in rows],
                [v.position for v in rows],
                [v.vector for v in rows],
            )

        await self._transaction(job)

    async def vectors(self, session: SessionRef, *, after: int = 0) -> StoredVectors:
        rows = await self._fetch(_READ, session.tenant, session.key, after)
        if not rows:
            return StoredVectors(None, [], after)
        found = [r for r in rows if r["seq"] is not None]
        return StoredVectors(
            int(rows[0]["session_id"]),
            [
                ItemVector(
                    int(r["item_id"]),
                    int(r["position"]),
                    str(r["content_hash"]),
                    bytes(r["vector"]),
                )
                for r in found
            ],
            int(found[-1]["seq"]) if found else after,
        )
