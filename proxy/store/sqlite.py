"""The SQLite store: WAL mode, reads on aiosqlite, writes group-committed by one writer.

Each exchange is one atomic job (undone alone if it fails, inside the writer's
transaction; see proxy/store/writer.py). Writers in other processes are
serialised by SQLite itself (``BEGIN IMMEDIATE`` plus a busy timeout). Reads
see only committed data, so they never observe half an exchange. The recall
index's short statements read on the event loop's thread (a connection of
their own, never waiting for a lock: :meth:`SqliteStore.fetch_short`).
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import aiosqlite
import orjson

from proxy.store import sqlite_jobs as jobs
from proxy.store import sqlite_purge as purge
from proxy.store import sqlite_summaries
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
from proxy.store.item_versions import ItemVersions
from proxy.store.migrations import MIGRATIONS, migrate
from proxy.store.registry import Backend, StoreSpec
from proxy.store.rows import item_from_row, request_from_row, summary_from_row
from proxy.store.sqlite_history import SqliteHistoryCache
from proxy.store.sqlite_items import ITEM_COLUMNS, PAGE_SIZE
from proxy.store.sqlite_search import SqliteRecallIndex
from proxy.store.sqlite_vectors import SqliteVectorIndex
from proxy.store.summary_memo import SummaryMemo
from proxy.store.writer import SqliteWriter

_T = TypeVar("_T")


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
    WHERE r.tenant = ? AND r.id = ?
"""

# The chain from the root to one of a response's two ends ({end}: a column name).
_RESPONSE_CHAIN = """
    WITH RECURSIVE chain (id, depth) AS (
        SELECT {end}, 0 FROM responses
            WHERE tenant = ? AND id = ? AND {end} IS NOT NULL
        UNION ALL
        SELECT items.parent_id, chain.depth + 1 FROM items JOIN chain ON items.id = chain.id
            WHERE items.parent_id IS NOT NULL
    )
    SELECT {columns} FROM chain JOIN items ON items.id = chain.id ORDER BY chain.depth DESC
"""


class StoreUnavailable(Exception):
    """The database cannot be read as asked (missing, not ours, or an older schema)."""


class SqliteStore:
    """Reads on an aiosqlite connection; writes through the group-committing writer."""

    backend: ClassVar[str] = "sqlite"

    def __init__(
        self, path: str | Path, *, busy_timeout: float = 5.0, caches: CacheBudget | None = None
    ) -> None:
        self.path = Path(path)
        caches = caches or CacheBudget()
        self._chains = ChainCache(max_bytes=caches.chains)
        self._histories = SqliteHistoryCache(max_bytes=caches.histories)
        self._summaries = SummaryMemo()
        # Each session's items' version, for the recall step's memo (proxy/store/item_versions.py).
        self._items = ItemVersions()
        self._busy_timeout_ms = int(busy_timeout * 1000)
        self._db: aiosqlite.Connection | None = None
        self._writer: SqliteWriter | None = None
        # Short reads on the event loop's own thread (fetch_short).
        self._inline: sqlite3.Connection | None = None

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; migrations issue BEGIN themselves.
        db = await aiosqlite.connect(self.path, isolation_level=None)
        writer = SqliteWriter(self.path, busy_timeout_ms=self._busy_timeout_ms)
        try:
            db.row_factory = sqlite3.Row
            await db.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            # Only a new database takes it (before its first write; WAL mode is one).
            await db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            await db.execute("PRAGMA journal_mode = WAL")
            await db.execute("PRAGMA synchronous = NORMAL")
            await db.execute("PRAGMA foreign_keys = ON")
            await migrate(db)
            if purge.FTS_SECURE_DELETE:
                await db.execute(purge.ENABLE_FTS_SECURE_DELETE)
            await writer.open()
        except BaseException:
            await db.close()
            raise
        self._db, self._writer = db, writer
        self._inline = _inline_reader(self.path)

    async def open_read_only(self) -> None:
        """Open for reading only (the CLI's read commands): never creates, migrates or writes.

        A missing file, a file that is not a ctxproxy database, or one whose
        schema is older than this code are a :class:`StoreUnavailable` saying so.
        """
        if not self.path.is_file():
            raise StoreUnavailable(f"no database at {str(self.path)!r}")
        uri = f"{self.path.absolute().as_uri()}?mode=ro"
        db = await aiosqlite.connect(uri, uri=True, isolation_level=None)
        try:
            db.row_factory = sqlite3.Row
            await db.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            try:
                async with db.execute("SELECT max(version) FROM schema_migrations") as cur:
                    row = await cur.fetchone()
            except sqlite3.DatabaseError as exc:
                raise StoreUnavailable(
                    f"{str(self.path)!r} is not a ctxproxy database ({exc})"
                ) from exc
            version = (row[0] if row else None) or 0
            if version < len(MIGRATIONS):
                raise StoreUnavailable(
                    f"{str(self.path)!r} has schema version {version}, this ctxproxy reads "
                    f"{len(MIGRATIONS)}: start the proxy on it once to migrate it"
                )
        except BaseException:
            await db.close()
            raise
        self._db = db

    async def close(self) -> None:
        if self._writer is not None:
            # Writes whose callers were cancelled finish first; their callers saw any error.
            writer, self._writer = self._writer, None
            await writer.close()
        if self._inline is not None:
            inline, self._inline = self._inline, None
            inline.close()
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

    @property
    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("SqliteStore is not open")
        return self._db

    def _write(
        self, job: Callable[[sqlite3.Connection], _T], *, inline: bool = True, urgent: bool = False
    ) -> Awaitable[_T]:
        return self._enqueue(job, inline=inline, urgent=urgent)

    def _enqueue(
        self, job: Callable[[sqlite3.Connection], _T], *, inline: bool = True, urgent: bool = False
    ) -> asyncio.Future[_T]:
        if self._writer is None:
            future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
            future.set_exception(RuntimeError("SqliteStore is not open"))
            return future
        return self._writer.enqueue(job, inline=inline, urgent=urgent)

    async def record_exchange(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
    ) -> ExchangeResult | None:
        """Store one exchange atomically (see ``Store.record_exchange``).

        A failed call (empty conversation, no reply) leaves the session row
        untouched, head and ``updated_at`` included; it returns the session id
        if the session exists and None otherwise.
        """
        # Awaited: a caller waits for the commit (history: server), no linger.
        return await self._record(session, conversation, reply, request, urgent=True)

    def record_exchange_soon(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
    ) -> asyncio.Future[ExchangeResult | None]:
        """``record_exchange``, queued now; the future has its result once committed.

        For the request path: no coroutine or task per exchange, only the
        job and its future.
        """
        return self._record(session, conversation, reply, request, urgent=False)

    def _record(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
        *,
        urgent: bool,
    ) -> asyncio.Future[ExchangeResult | None]:
        conversation = list(conversation)
        if session is None or (not conversation and reply is None):
            return self._enqueue(
                functools.partial(jobs.record, session, conversation, reply, request, None),
                urgent=urgent,
            )
        content = [m.content_hash for m in conversation]
        if reply is not None:
            content.append(reply.content_hash)
        # The session's resent prefix: path hashes and item ids from its last stored chain.
        prefix = self._chains.prefix(session, content)
        future = self._enqueue(
            functools.partial(jobs.record, session, conversation, reply, request, prefix),
            urgent=urgent,
        )
        future.add_done_callback(
            functools.partial(self._chain_committed, session, content, prefix.path_hashes)
        )
        return future

    def _chain_committed(
        self,
        session: SessionRef,
        content: list[str],
        paths: list[str],
        future: asyncio.Future[ExchangeResult | None],
    ) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        result = future.result()
        if result is not None:
            self._summaries.written(session, result.session_id)
            ids = [*result.item_ids, *([] if result.reply_id is None else [result.reply_id])]
            self._chains.committed(session, result.session_id, content, paths, ids)
            self._items.committed(session, result.session_id, ids)

    async def _fetch(self, query: str, params: tuple[Any, ...]) -> list[sqlite3.Row]:
        return list(await self._conn.execute_fetchall(query, params))

    async def fetch(self, query: str, params: tuple[Any, ...]) -> list[sqlite3.Row]:
        """One read on the store's connection (the vector index's)."""
        return await self._fetch(query, params)

    async def fetch_short(self, query: str, params: tuple[Any, ...]) -> list[Any]:
        """One short read (the recall index's statements, a fraction of a millisecond)
        on the event loop's thread: no hop to the read thread and back, and no wait
        behind the reads queued there. Rows are plain tuples.

        The connection never waits for a lock (``busy_timeout`` 0; in WAL mode a
        reader hardly ever meets one): a busy or locked database sends the read
        to the read thread instead, as does a store opened read-only.
        """
        inline = self._inline
        if inline is not None:
            try:
                return inline.execute(query, params).fetchall()
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    raise
        return list(await self._fetch(query, params))

    def items_version(self, session: SessionRef) -> int | None:
        """The version of the session's stored items (proxy/store/item_versions.py)."""
        return self._items.version(session)

    async def write(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """One job on the store's writer, atomic on its own (the vector index's writes)."""
        return await self._write(job)

    async def history(self, session: SessionRef, *, shared: bool = False) -> list[StoredItem]:
        """The chain, from this instance's cache when the session's head says it is current."""
        return await self._histories.history(self._fetch, session, shared=shared)

    async def get_session(self, session: SessionRef) -> SessionInfo | None:
        query = _SESSION_INFO + " WHERE s.tenant = ? AND s.key = ?"
        rows = await self._fetch(query, (session.tenant, session.key))
        return SessionInfo(*rows[0]) if rows else None

    async def list_sessions(
        self,
        tenant: str | None = None,
        limit: int = 50,
        offset: int = 0,
        key_contains: str | None = None,
    ) -> list[SessionInfo]:
        conditions: list[str] = []
        params: list[str] = []
        if tenant is not None:
            conditions.append("s.tenant = ?")
            params.append(tenant)
        if key_contains is not None:
            # instr, not LIKE: case-sensitive as the keys are, and no wildcards to escape.
            conditions.append("instr(s.key, ?) > 0")
            params.append(key_contains)
        where = " WHERE " + " AND ".join(conditions) if conditions else ""
        query = _SESSION_INFO + where + " ORDER BY s.updated_at DESC, s.id DESC LIMIT ? OFFSET ?"
        rows = await self._fetch(query, (*params, limit, offset))
        return [SessionInfo(*row) for row in rows]

    async def requests(self, session: SessionRef) -> list[dict[str, Any]]:
        """Every request that named the session, those made before it existed included."""
        query = (
            "SELECT * FROM requests WHERE tenant = ? AND session_key = ? ORDER BY created_at, rowid"
        )
        return [_request(row) for row in await self._fetch(query, (session.tenant, session.key))]

    async def request(self, request_id: str) -> dict[str, Any] | None:
        rows = await self._fetch("SELECT * FROM requests WHERE id = ?", (request_id,))
        return _request(rows[0]) if rows else None

    async def delete_session(self, session: SessionRef) -> bool:
        """Delete the session, its items and every request that named it.

        Returns False if there was no session row (requests that named it
        before it existed are deleted all the same).
        """
        requests = "DELETE FROM requests WHERE tenant = ? AND session_key = ?"
        sessions = "DELETE FROM sessions WHERE tenant = ? AND key = ? RETURNING id"
        self._chains.forget(session)
        self._histories.forget(session)
        try:
            return bool(await self._delete(requests, sessions, (session.tenant, session.key)))
        finally:
            self._summaries.changed()
            self._items.changed(session)

    async def delete_idle_sessions(self, older_than: float) -> int:
        # Requests made before their session existed have no session id for
        # the cascade to follow: they go by name.
        requests = (
            "DELETE FROM requests WHERE session_id IS NULL AND (tenant, session_key) IN"
            " (SELECT tenant, key FROM sessions WHERE updated_at < ?)"
        )
        sessions = "DELETE FROM sessions WHERE updated_at < ? RETURNING id"
        try:
            return len(await self._delete(requests, sessions, (older_than,)))
        finally:
            self._summaries.changed()
            self._items.changed()

    async def _delete(self, requests: str, sessions: str, params: tuple[Any, ...]) -> list[int]:
        # Whole sessions (maybe thousands of rows): on the writer's thread, not the loop.
        job = functools.partial(jobs.delete_rows, requests, sessions, params)
        deleted: list[int] = await self._purge(job)
        return deleted

    async def purge(self) -> list[str]:
        """Rewrite the recall index and the file (VACUUM), then empty the WAL: what a
        deletion leaves is already gone (proxy/store/sqlite_purge.py); this also gives
        the free pages back to the filesystem."""
        await asyncio.to_thread(purge.vacuum, self.path, self._busy_timeout_ms)
        return ["FTS5 optimize items_fts", "VACUUM", "wal_checkpoint(TRUNCATE)"]

    async def _purge(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """A deletion that leaves none of the deleted text on disk (proxy/store/sqlite_purge.py)."""
        result = await self._write(functools.partial(purge.purging, job), inline=False)
        if result:
            await purge.truncate_wal(self.path, self._busy_timeout_ms)
        return result

    # -- Responses API ----------------------------------------------------------

    async def record_response(
        self,
        session: SessionRef,
        conversation: Sequence[Storable],
        output: Sequence[MessageIn],
        response: ResponseIn,
        request: RequestRecord,
    ) -> ExchangeResult:
        """Store one response atomically (see ``Store.record_response``)."""
        job = functools.partial(
            jobs.record_response, session, list(conversation), list(output), response, request
        )
        # The client gets its answer after this commit: no linger.
        result: ExchangeResult = await self._write(job, urgent=True)
        self._summaries.written(session, result.session_id)
        self._items.changed(session)
        return result

    async def get_response(self, tenant: str, response_id: str) -> StoredResponse | None:
        rows = await self._fetch(_RESPONSE, (tenant, response_id))
        if not rows:
            return None
        columns = dict(rows[0])
        response = orjson.loads(columns.pop("response_json"))
        return StoredResponse(**columns, response=response)

    async def response_exists(self, response_id: str) -> bool:
        rows = await self._fetch("SELECT 1 FROM responses WHERE id = ? LIMIT 1", (response_id,))
        return bool(rows)

    async def response_chain(self, tenant: str, response_id: str) -> list[StoredItem]:
        query = _RESPONSE_CHAIN.format(end="head_item_id", columns=ITEM_COLUMNS)
        return [_item(row) for row in await self._fetch(query, (tenant, response_id))]

    async def response_input_items(self, tenant: str, response_id: str) -> list[StoredItem]:
        query = _RESPONSE_CHAIN.format(end="input_head_item_id", columns=ITEM_COLUMNS)
        return [_item(row) for row in await self._fetch(query, (tenant, response_id))]

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        # A walk along the chain: on the writer's thread, not the loop.
        job = functools.partial(jobs.delete_response, tenant, response_id)
        try:
            return await self._purge(job)
        finally:
            self._summaries.changed()
            self._items.changed()

    # -- summaries (proxy/store/sqlite_summaries.py) ----------------------------

    async def save_summary(
        self, session: SessionRef, covered: Sequence[Storable], summary: SummaryIn
    ) -> StoredSummary:
        """Store a summary and the items it covers atomically (see ``Store.save_summary``)."""
        job = functools.partial(
            sqlite_summaries.save_summary_job, jobs.store_chain, session, list(covered), summary
        )
        try:
            stored: StoredSummary = await self._write(job)
        except BaseException:
            self._summaries.changed(session)
            raise
        finally:
            self._items.changed(session)
        self._summaries.saved(session, stored)
        return stored

    async def summaries(self, session: SessionRef) -> list[StoredSummary]:
        rows = await self._fetch(sqlite_summaries.SESSION_SUMMARIES, (session.tenant, session.key))
        return [summary_from_row(row) for row in rows]

    async def _session_summaries(
        self, session: SessionRef
    ) -> tuple[int | None, list[StoredSummary]]:
        """The session's id (None: none) and its summaries: what the memo keeps."""
        rows = await self._fetch(
            "SELECT id FROM sessions WHERE tenant = ? AND key = ?", (session.tenant, session.key)
        )
        if not rows:
            return None, []
        return int(rows[0][0]), await self.summaries(session)

    async def summaries_for(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int = 4
    ) -> list[StoredSummary]:
        # Memoized per session (proxy/store/summary_memo.py): no read while nothing changed.
        found = await self._summaries.summaries(session, lambda: self._session_summaries(session))
        return sqlite_summaries.covering_summaries(found, path_hashes, limit)

    def summaries_known(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int = 4
    ) -> list[StoredSummary] | None:
        found = self._summaries.known(session)
        if found is None:
            return None
        return sqlite_summaries.covering_summaries(found, path_hashes, limit)


_item = item_from_row
_request = request_from_row


def _inline_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection for :meth:`SqliteStore.fetch_short`: autocommit (each
    statement its own snapshot, ended when its rows are fetched), never waiting."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 0")
    conn.execute("PRAGMA query_only = ON")
    return conn


def _busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def _build(spec: StoreSpec) -> SqliteStore:
    return SqliteStore(spec.path, caches=spec.caches)


def _recall(store: SqliteStore) -> SqliteRecallIndex:
    return SqliteRecallIndex(store.fetch_short)


def _vectors(store: SqliteStore) -> SqliteVectorIndex:
    return SqliteVectorIndex(store.fetch, store.write)


def _versions(store: SqliteStore) -> Callable[[SessionRef], int | None]:
    return store.items_version


BACKEND: Backend[SqliteStore] = Backend("sqlite", _build, _recall, _vectors, _versions)
