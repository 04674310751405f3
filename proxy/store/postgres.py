"""The PostgreSQL store: the Store protocol on asyncpg, for several instances sharing sessions.

Why asyncpg (not psycopg 3): it speaks PostgreSQL's binary protocol from
Cython, prepares and caches every statement per connection on its own, and
has its own pool; a request's few statements cost tens of microseconds of
client CPU instead of hundreds. The proxy is asyncio-only, so psycopg's sync
API buys nothing here.

Every write runs in one transaction on one pooled connection
(proxy/store/postgres_jobs.py): an exchange's session row, items and request
row commit together or not at all. Reads run on any pooled connection and see
only committed transactions (READ COMMITTED), never half an exchange.

The chain cache (proxy/store/chains.py) is per instance and safe to share a
database with other instances: it holds only immutable facts (a session's
item ids, never reused by an identity column), checked against the session id
each write upserts.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, TypeVar

import asyncpg
import orjson

from proxy.store import postgres_jobs as jobs
from proxy.store.base import (
    CacheBudget,
    ExchangeResult,
    MessageIn,
    RequestRecord,
    ResponseIn,
    SessionInfo,
    SessionRef,
    Storable,
    StoredItem,
    StoredResponse,
    StoredSummary,
    SummaryIn,
)
from proxy.store.chains import ChainCache
from proxy.store.postgres_history import ITEM_COLUMNS, PostgresHistoryCache
from proxy.store.postgres_schema import migrate
from proxy.store.postgres_search import PostgresRecallIndex
from proxy.store.postgres_vectors import PostgresVectorIndex
from proxy.store.registry import Backend, StoreSpec
from proxy.store.rows import item_from_row, request_from_row, summary_from_row
from proxy.store.sqlite_summaries import covering

_T = TypeVar("_T")

# Every table a conversation's words reach (messages, replies, summaries, request details).
PURGED_TABLES = ("items", "summaries", "requests", "responses", "sessions", "item_vectors")

SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_SESSION_INFO = """
    SELECT s.id, s.tenant, s.key, s.created_at, s.updated_at, s.head_item_id,
        (SELECT COUNT(*) FROM items i WHERE i.session_id = s.id) AS item_count,
        (SELECT COUNT(*) FROM requests r
            WHERE r.tenant = s.tenant AND r.session_key = s.key) AS request_count,
        (SELECT COALESCE(SUM(i.token_count), 0) FROM items i
            WHERE i.session_id = s.id) AS stored_tokens
    FROM sessions s
"""

_RESPONSE = """
    SELECT r.id, r.tenant, r.session_id, s.key AS session_key, r.head_item_id,
        r.input_head_item_id, r.previous_response_id, r.model, r.status, r.response_json,
        r.created_at
    FROM responses r JOIN sessions s ON s.id = r.session_id
    WHERE r.tenant = $1 AND r.id = $2
"""

_RESPONSE_CHAIN = """
    WITH RECURSIVE chain (id, depth) AS (
        SELECT {end}, 0 FROM responses
            WHERE tenant = $1 AND id = $2 AND {end} IS NOT NULL
        UNION ALL
        SELECT items.parent_id, chain.depth + 1 FROM items JOIN chain ON items.id = chain.id
            WHERE items.parent_id IS NOT NULL
    )
    SELECT {columns} FROM chain JOIN items ON items.id = chain.id ORDER BY chain.depth DESC
"""

_SESSION_SUMMARIES = """
    SELECT summaries.* FROM summaries JOIN sessions ON sessions.id = summaries.session_id
    WHERE sessions.tenant = $1 AND sessions.key = $2 ORDER BY summaries.id
"""

_SESSION_COVERS = """
    SELECT summaries.id, summaries.covers_path_hash FROM summaries
    JOIN sessions ON sessions.id = summaries.session_id
    WHERE sessions.tenant = $1 AND sessions.key = $2
"""

_REQUEST_COLUMNS = jobs.REQUEST_COLUMNS


class PostgresStore:
    """A pool of asyncpg connections; one transaction per write."""

    backend: ClassVar[str] = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        schema: str | None = None,
        connect_timeout: float = 10.0,
        caches: CacheBudget | None = None,
    ) -> None:
        if schema is not None and not SCHEMA_NAME.fullmatch(schema):
            raise ValueError(f"invalid schema name: {schema!r}")
        self.url = url
        self.schema = schema
        self.pool_size = pool_size
        self._connect_timeout = connect_timeout
        caches = caches or CacheBudget()
        self._chains = ChainCache(max_bytes=caches.chains)
        self._histories = PostgresHistoryCache(max_bytes=caches.histories)
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        settings = {"search_path": self.schema} if self.schema else {}
        # Migrations first, on their own connection (the schema may not exist yet).
        conn = await asyncpg.connect(
            self.url, timeout=self._connect_timeout, server_settings=settings
        )
        try:
            await migrate(conn, self.schema)
        finally:
            await conn.close()
        self._pool = await asyncpg.create_pool(
            self.url,
            min_size=min(2, self.pool_size),
            max_size=self.pool_size,
            timeout=self._connect_timeout,
            server_settings=settings,
        )

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("PostgresStore is not open")
        return self._pool

    async def _transaction(self, job: Callable[[Any], Awaitable[_T]]) -> _T:
        async with self.pool.acquire() as conn, conn.transaction():
            return await job(conn)

    async def _fetch(self, query: str, *args: Any) -> list[Any]:
        return list(await self.pool.fetch(query, *args))

    # -- exchanges --------------------------------------------------------------

    async def record_exchange(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
    ) -> ExchangeResult | None:
        conversation = list(conversation)
        if session is None or (not conversation and reply is None):
            return await self._transaction(
                lambda c: jobs.record(c, session, conversation, reply, request, None)
            )
        content = [m.content_hash for m in conversation]
        if reply is not None:
            content.append(reply.content_hash)
        prefix = self._chains.prefix(session, content)
        result = await self._transaction(
            lambda c: jobs.record(c, session, conversation, reply, request, prefix)
        )
        if result is not None:
            ids = [*result.item_ids, *([] if result.reply_id is None else [result.reply_id])]
            self._chains.committed(session, result.session_id, content, prefix.path_hashes, ids)
        return result

    def record_exchange_soon(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
    ) -> asyncio.Future[ExchangeResult | None]:
        return asyncio.ensure_future(self.record_exchange(session, conversation, reply, request))

    async def history(self, session: SessionRef, *, shared: bool = False) -> list[StoredItem]:
        """The chain to the head, from this instance's cache once PostgreSQL says it is current."""
        async with self.pool.acquire() as conn:
            return await self._histories.history(conn, session, shared=shared)

    async def advance_fence(self, session: SessionRef, token: int) -> None:
        """A new holder of the session's lock: from now on, writes with older tokens are refused.

        Called when the lock is taken, before the holder reads anything, so a
        holder whose lease lapsed cannot write after the next holder began,
        whoever writes first. Not a write of the session: no version bump.
        """
        await self.pool.execute(
            "UPDATE sessions SET fence = GREATEST(fence, $3) WHERE tenant = $1 AND key = $2",
            session.tenant,
            session.key,
            token,
        )

    async def session_version(self, session: SessionRef) -> int:
        """The session's write counter (0: no such session); every write bumps it."""
        version = await self.pool.fetchval(
            "SELECT version FROM sessions WHERE tenant = $1 AND key = $2",
            session.tenant,
            session.key,
        )
        return 0 if version is None else int(version)

    async def get_session(self, session: SessionRef) -> SessionInfo | None:
        query = _SESSION_INFO + " WHERE s.tenant = $1 AND s.key = $2"
        rows = await self._fetch(query, session.tenant, session.key)
        return SessionInfo(*rows[0]) if rows else None

    async def list_sessions(
        self,
        tenant: str | None = None,
        limit: int = 50,
        offset: int = 0,
        key_contains: str | None = None,
    ) -> list[SessionInfo]:
        conditions: list[str] = []
        args: list[Any] = []
        if tenant is not None:
            args.append(tenant)
            conditions.append(f"s.tenant = ${len(args)}")
        if key_contains is not None:
            # strpos, not LIKE: case-sensitive as the keys are, and no wildcards to escape.
            args.append(key_contains)
            conditions.append(f"strpos(s.key, ${len(args)}) > 0")
        where = " WHERE " + " AND ".join(conditions) if conditions else ""
        page = (
            f" ORDER BY s.updated_at DESC, s.id DESC LIMIT ${len(args) + 1} OFFSET ${len(args) + 2}"
        )
        rows = await self._fetch(_SESSION_INFO + where + page, *args, limit, offset)
        return [SessionInfo(*row) for row in rows]

    async def requests(self, session: SessionRef) -> list[dict[str, Any]]:
        query = (
            f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE tenant = $1 AND session_key = $2"
            " ORDER BY created_at, seq"
        )
        return [request_from_row(r) for r in await self._fetch(query, session.tenant, session.key)]

    async def request(self, request_id: str) -> dict[str, Any] | None:
        query = f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE id = $1"
        rows = await self._fetch(query, request_id)
        return request_from_row(rows[0]) if rows else None

    async def delete_session(self, session: SessionRef) -> bool:
        self._chains.forget(session)
        self._histories.forget(session)

        async def job(conn: Any) -> bool:
            await conn.execute(
                "DELETE FROM requests WHERE tenant = $1 AND session_key = $2",
                session.tenant,
                session.key,
            )
            deleted = await conn.fetch(
                "DELETE FROM sessions WHERE tenant = $1 AND key = $2 RETURNING id",
                session.tenant,
                session.key,
            )
            return bool(deleted)

        return await self._transaction(job)

    async def delete_idle_sessions(self, older_than: float) -> int:
        async def job(conn: Any) -> int:
            # Requests made before their session existed have no session id to cascade on.
            await conn.execute(
                "DELETE FROM requests WHERE session_id IS NULL AND (tenant, session_key) IN"
                " (SELECT tenant, key FROM sessions WHERE updated_at < $1)",
                older_than,
            )
            rows = await conn.fetch(
                "DELETE FROM sessions WHERE updated_at < $1 RETURNING id", older_than
            )
            return len(rows)

        return await self._transaction(job)

    async def purge(self) -> list[str]:
        """VACUUM FULL each table that holds conversation text: a plain VACUUM (or
        autovacuum) unlinks dead tuples and index entries, but their bytes stay in the
        pages' free space until reused; FULL writes each table and index anew. It holds
        each table's ACCESS EXCLUSIVE lock while it runs: the proxy's writes wait."""
        steps = []
        async with self.pool.acquire() as conn:
            for table in PURGED_TABLES:
                await conn.execute(f"VACUUM (FULL) {table}")
                steps.append(f"VACUUM (FULL) {self.schema or 'public'}.{table}")
        return steps

    # -- Responses API ------------------------------------------------------------

    async def record_response(
        self,
        session: SessionRef,
        conversation: Sequence[Storable],
        output: Sequence[MessageIn],
        response: ResponseIn,
        request: RequestRecord,
    ) -> ExchangeResult:
        return await self._transaction(
            lambda c: jobs.record_response(
                c, session, list(conversation), list(output), response, request
            )
        )

    async def get_response(self, tenant: str, response_id: str) -> StoredResponse | None:
        rows = await self._fetch(_RESPONSE, tenant, response_id)
        if not rows:
            return None
        columns = dict(rows[0])
        response = orjson.loads(columns.pop("response_json"))
        return StoredResponse(**columns, response=response)

    async def response_exists(self, response_id: str) -> bool:
        found = await self.pool.fetchval(
            "SELECT 1 FROM responses WHERE id = $1 LIMIT 1", response_id
        )
        return found is not None

    async def response_chain(self, tenant: str, response_id: str) -> list[StoredItem]:
        query = _RESPONSE_CHAIN.format(end="head_item_id", columns=ITEM_COLUMNS)
        return [item_from_row(r) for r in await self._fetch(query, tenant, response_id)]

    async def response_input_items(self, tenant: str, response_id: str) -> list[StoredItem]:
        query = _RESPONSE_CHAIN.format(end="input_head_item_id", columns=ITEM_COLUMNS)
        return [item_from_row(r) for r in await self._fetch(query, tenant, response_id)]

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        return await self._transaction(lambda c: jobs.delete_response(c, tenant, response_id))

    # -- summaries ------------------------------------------------------------------

    async def save_summary(
        self, session: SessionRef, covered: Sequence[Storable], summary: SummaryIn
    ) -> StoredSummary:
        covered = list(covered)
        if not covered:
            raise ValueError("a summary must cover at least one item")
        return await self._transaction(lambda c: jobs.save_summary(c, session, covered, summary))

    async def summaries(self, session: SessionRef) -> list[StoredSummary]:
        rows = await self._fetch(_SESSION_SUMMARIES, session.tenant, session.key)
        return [summary_from_row(r) for r in rows]

    async def summaries_for(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int = 4
    ) -> list[StoredSummary]:
        covers = await self._fetch(_SESSION_COVERS, session.tenant, session.key)
        ids = covering([(r[0], r[1]) for r in covers], path_hashes, limit)
        if not ids:
            return []
        rows = await self._fetch("SELECT * FROM summaries WHERE id = ANY($1::bigint[])", ids)
        by_id = {r["id"]: summary_from_row(r) for r in rows}
        return [by_id[i] for i in ids]

    def summaries_known(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int = 4
    ) -> list[StoredSummary] | None:
        # Other instances write summaries too, and nothing tells this one: always read.
        return None


def _build(spec: StoreSpec) -> PostgresStore:
    if spec.url is None:
        raise ValueError("the PostgreSQL store needs a store URL")
    return PostgresStore(spec.url, pool_size=spec.pool_size, schema=spec.schema, caches=spec.caches)


# The indexes run their statements on the store's pool, as its own methods do.
def _recall(store: PostgresStore) -> PostgresRecallIndex:
    return PostgresRecallIndex(store._fetch)


def _vectors(store: PostgresStore) -> PostgresVectorIndex:
    return PostgresVectorIndex(store._fetch, store._transaction)


BACKEND: Backend[PostgresStore] = Backend("postgresql", _build, _recall, _vectors)
