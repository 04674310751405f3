"""The SQLite writer: one connection on one thread, many jobs per transaction (group commit).

Every write of the store is a *job*: a plain function over a ``sqlite3``
connection. Jobs queue up while the previous transaction runs; the writer
then runs all of them in one transaction with one hop to its thread, each job
inside its own SAVEPOINT, so one failing job rolls back only itself. Under
load this turns a dozen thread hops and a commit per request into one hop and
one commit per batch; a lone request pays one hop and one commit.

Reads stay on the store's aiosqlite connection: in WAL mode they never wait
for this writer, and they see only committed transactions.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")

Job = Callable[[sqlite3.Connection], Any]

# Group commit under load: a batch that starts within _BUSY_S of the previous
# one waits _LINGER_S for company, unless _BATCH_TARGET jobs are queued already.
_LINGER_S = 0.002
_BUSY_S = 0.010
_BATCH_TARGET = 16


class SqliteWriter:
    def __init__(self, path: Path, *, busy_timeout_ms: int) -> None:
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxproxy-writer")
        self._conn: sqlite3.Connection | None = None
        self._queue: list[tuple[Job, asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None
        self._last_batch = float("-inf")

    async def open(self) -> None:
        self._conn = await asyncio.get_running_loop().run_in_executor(self._executor, self._connect)

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; the writer issues BEGIN itself.
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    async def close(self) -> None:
        while self._task is not None:
            await asyncio.shield(self._task)
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=True)

    async def submit(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``job`` in a transaction; it finishes even if the caller is cancelled.

        A client that went away still wants its exchange kept, and a job cut
        off midway would leave nothing consistent behind anyway.
        """
        if self._conn is None:
            raise RuntimeError("SqliteStore is not open")
        future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        self._queue.append((job, future))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        return await asyncio.shield(future)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            # One turn of the event loop first: requests finishing in the same
            # tick join this batch instead of paying for a transaction each.
            await asyncio.sleep(0)
            if loop.time() - self._last_batch < _BUSY_S and len(self._queue) < _BATCH_TARGET:
                # Busy (the previous batch began moments ago): linger briefly so
                # several requests share one hop to the writer thread and one
                # commit. Each hop wakes a thread that must take the GIL from
                # the event loop, which costs more than the write itself. An
                # idle proxy's lone request is written at once.
                await asyncio.sleep(_LINGER_S)
            while self._queue:
                self._last_batch = loop.time()
                batch, self._queue = self._queue, []
                outcomes = await loop.run_in_executor(
                    self._executor, self._commit, [job for job, _ in batch]
                )
                for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        finally:
            self._task = None

    def _commit(self, jobs: list[Job]) -> list[tuple[bool, Any]]:
        """In the writer thread: all jobs in one transaction, each in its own savepoint."""
        conn = self._conn
        if conn is None:
            error = RuntimeError("SqliteStore is not open")
            return [(False, error) for _ in jobs]
        outcomes: list[tuple[bool, Any]] = []
        try:
            # IMMEDIATE: take the write lock up front, so a job's lookups and
            # inserts see one state even with writers in other processes.
            conn.execute("BEGIN IMMEDIATE")
            for job in jobs:
                conn.execute("SAVEPOINT job")
                try:
                    outcomes.append((True, job(conn)))
                except Exception as exc:  # the job's own failure goes to its caller, not the batch
                    conn.execute("ROLLBACK TO job")
                    outcomes.append((False, exc))
                conn.execute("RELEASE job")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # BEGIN or COMMIT failed (locked past busy_timeout, disk full...): nothing is kept.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [(False, exc) for _ in jobs]
        return outcomes
