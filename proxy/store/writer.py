"""The SQLite writer: group commit on the event loop's thread; a helper thread for the rest.

Every write of the store is a *job*: a plain function over a ``sqlite3``
connection. Jobs queue up while the previous transaction runs; the writer
then runs all of them in one transaction, and one failing job rolls back
only itself (the batch runs again, each job in its own SAVEPOINT: see ``_commit``).

Where they run: on the event loop's own thread. A request's job is a few
tens of microseconds of SQLite plus its share of a commit (no fsync: WAL
with ``synchronous = NORMAL``). Handing it to a thread cost more: each
``sqlite3`` call releases and retakes the GIL, and each retake waits for the
busy event loop; a writer thread preempted while holding the GIL stalled the
loop for a scheduler tick (the 4-5 ms p99 at concurrency 1); and under
sustained load the thread fell behind, so unwritten exchanges piled up and
made every full garbage collection slower.

What must not block the loop goes to a helper thread with its own connection:

- a batch that finds the database locked by another process (the loop's
  connection never waits for a lock; the helper's waits up to the busy timeout),
- jobs submitted with ``inline=False`` (deleting whole sessions),
- WAL checkpoints (the loop's connection never checkpoints: a checkpoint
  copies pages into the database file and fsyncs it).

Reads stay on the store's aiosqlite connection: in WAL mode they never wait
for this writer, and they see only committed transactions.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

from proxy.telemetry.logging import get_logger

log = get_logger()

_T = TypeVar("_T")

Job = Callable[[sqlite3.Connection], Any]
# A job's outcome: (True, its result) or (False, the exception it raised).
Outcome = tuple[bool, Any]

# Group commit under load: a batch that starts within _BUSY_S of the previous
# one waits _LINGER_S for company, unless or until _BATCH_TARGET jobs are queued.
# 6 ms: requests one at a time (~1.2 ms apart on loopback) share a commit five or
# so at a time, so one answer in five meets a commit on the loop, not one in two
# (bench/overhead.py trim+s c=1 against 2 ms, two runs: p50 -0.08 ms, CPU per
# request 0.87-0.89x). What lingers is client-held history, written after its
# answer: the client holds the reply. A job a client waits for (``urgent``) never
# lingers past _URGENT_LINGER_S.
_LINGER_S = 0.006
_URGENT_LINGER_S = 0.002
_BUSY_S = 0.010
_BATCH_TARGET = 16
# At most this many jobs per transaction on the loop, so one batch never holds
# the loop for long (a few milliseconds at most).
_MAX_BATCH = 64
# A checkpoint (on the helper thread, between two batches) after this many
# commits: SQLite's own default is every 1000 WAL pages, and a commit writes a
# handful of pages.
_CHECKPOINT_COMMITS = 200
# WAL hygiene: a PASSIVE checkpoint copies pages but never shrinks the file, so
# a burst once left a 167 MB WAL beside the database for good. After _IDLE_S
# without writes, a TRUNCATE checkpoint empties it (to 0 bytes); and whenever a
# checkpoint restarts the WAL, SQLite cuts it back to _JOURNAL_SIZE_LIMIT.
_IDLE_S = 1.0
_JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024


class SqliteWriter:
    def __init__(self, path: Path, *, busy_timeout_ms: int) -> None:
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxproxy-writer")
        # The loop's connection: no busy timeout, no automatic checkpoints.
        self._conn: sqlite3.Connection | None = None
        # The helper thread's connection: waits for locks, checkpoints.
        self._helper: sqlite3.Connection | None = None
        self._queue: list[tuple[Job, asyncio.Future[Any], bool]] = []
        # Whether a queued job is one a client waits for (``enqueue(urgent=True)``).
        self._urgent = False
        self._last_size = 0
        self._task: asyncio.Task[None] | None = None
        self._last_batch = float("-inf")
        # Batches that lingered for company (for tests and diagnostics).
        self.lingers = 0
        self._commits = 0
        # Commits since the WAL was last truncated, and the idle timer that will.
        self._dirty = 0
        self._idle: asyncio.TimerHandle | None = None
        # The loop the store was opened on (asyncio.get_running_loop() costs a
        # getpid() syscall per call on Python 3.11).
        self._loop: asyncio.AbstractEventLoop | None = None
        # While a batch lingers for company: what ends the linger early, and when it began.
        self._linger: asyncio.Future[None] | None = None
        self._linger_start = 0.0

    async def open(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        # Both connected on the helper thread, waiting for locks as configured
        # (setting WAL mode may have to, when another process is writing)...
        self._helper = await loop.run_in_executor(self._executor, self._connect)
        conn = await loop.run_in_executor(self._executor, self._connect)
        # ...then the loop's connection never waits for a lock (a batch that
        # would is handed to the helper) and never checkpoints.
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        self._conn = conn

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; the writer issues BEGIN itself.
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA journal_size_limit = {_JOURNAL_SIZE_LIMIT}")
        conn.execute("PRAGMA secure_delete = ON")  # freed space zeroed: proxy/store/sqlite_purge.py
        return conn

    async def close(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._end_linger()
        while self._task is not None:
            await asyncio.shield(self._task)
        loop = asyncio.get_running_loop()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
        if self._helper is not None:
            helper, self._helper = self._helper, None
            await loop.run_in_executor(self._executor, helper.close)
        self._executor.shutdown(wait=True)

    def enqueue(
        self, job: Callable[[sqlite3.Connection], _T], *, inline: bool = True, urgent: bool = False
    ) -> asyncio.Future[_T]:
        """Queue ``job``; the future gets its result once its transaction has committed.

        Never raises: a store that is not open fails the future. The job runs
        whatever becomes of the future (a caller that went away still wants
        its exchange kept, and a job cut off midway would leave nothing
        consistent behind anyway). ``inline``: False for jobs that may take
        long (deleting whole sessions), which run on the helper thread; jobs
        still run in the order queued. ``urgent``: a client waits for this
        commit before it gets its answer (``history: server``, Responses), so
        the batch it joins does not linger for company.
        """
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        if self._conn is None:
            future.set_exception(RuntimeError("SqliteStore is not open"))
            return future
        self._queue.append((job, future, inline))
        if len(self._queue) >= _BATCH_TARGET:
            self._end_linger()  # company enough: no need to wait the rest
        if urgent:
            self._urgent = True
            if self._linger is not None:
                # A client waits for this one: the linger goes no further than its cap.
                loop.call_at(self._linger_start + _URGENT_LINGER_S, self._end, self._linger)
        if self._task is None:
            self._task = loop.create_task(self._run())
        return future

    def _end_linger(self) -> None:
        if self._linger is not None:
            self._end(self._linger)

    @staticmethod
    def _end(linger: asyncio.Future[None]) -> None:
        if not linger.done():
            linger.set_result(None)

    async def submit(self, job: Callable[[sqlite3.Connection], _T], *, inline: bool = True) -> _T:
        """Run ``job`` in a transaction (see ``enqueue``), even if the caller is cancelled."""
        return await self.enqueue(job, inline=inline)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            # One turn of the event loop first: requests finishing in the same
            # tick join this batch instead of paying for a transaction each.
            await asyncio.sleep(0)
            if (
                loop.time() - self._last_batch < _BUSY_S
                and len(self._queue) < _BATCH_TARGET
                and not (self._urgent and self._last_size == 1)
            ):
                # Busy (the previous batch began moments ago): linger briefly so
                # several requests share one commit. An idle proxy's lone
                # request is written at once, and so is one a client waits for
                # when batches hold one job (requests one at a time, where the
                # linger would be all the client's wait: 2 ms and more).
                await self._linger_for_company(loop)
            while self._queue:
                self._urgent = False
                self._last_batch = loop.time()
                batch = self._take()
                self._last_size = len(batch)
                jobs = [job for job, _, _ in batch]
                outcomes = self._commit(self._conn, jobs, fallback=True) if batch[0][2] else None
                if outcomes is None:
                    # Locked by another process, or a long job: wait on the helper thread.
                    outcomes = await loop.run_in_executor(
                        self._executor, self._commit_waiting, jobs
                    )
                self._settle(batch, outcomes)
                self._commits += 1
                self._dirty += 1
                if self._commits >= _CHECKPOINT_COMMITS:
                    self._commits = 0
                    await self._checkpoint(loop)
                if self._queue:
                    # Let responses and reads through between two batches.
                    await asyncio.sleep(0)
        finally:
            self._task = None
            self._arm_idle(loop)

    async def _linger_for_company(self, loop: asyncio.AbstractEventLoop) -> None:
        """_LINGER_S (_URGENT_LINGER_S with a job a client waits for), unless
        _BATCH_TARGET jobs are queued first (or the writer closes)."""
        self.lingers += 1
        self._linger = linger = loop.create_future()
        self._linger_start = loop.time()
        delay = _URGENT_LINGER_S if self._urgent else _LINGER_S
        timer = loop.call_later(delay, self._end, linger)
        try:
            await linger
        finally:
            timer.cancel()
            self._linger = None

    def _arm_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        """After the last batch: truncate the WAL once nothing was written for _IDLE_S."""
        if self._idle is not None:
            self._idle.cancel()
        self._idle = loop.call_later(_IDLE_S, self._on_idle, loop) if self._dirty else None

    def _on_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        self._idle = None
        if self._task is None and not self._queue and self._conn is not None and self._dirty:
            # As a batch would: jobs queued meanwhile wait for it, then run.
            self._task = loop.create_task(self._truncate(loop))

    async def _truncate(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            await loop.run_in_executor(self._executor, self._truncate_wal)
            self._dirty = 0
        except sqlite3.Error as exc:  # busy readers: the next idle period tries again
            log.warning("wal_truncate_failed", error=repr(exc))
        finally:
            self._task = None
            if self._queue:
                self._task = loop.create_task(self._run())

    def _truncate_wal(self) -> None:
        if self._helper is not None:
            self._helper.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def _take(self) -> list[tuple[Job, asyncio.Future[Any], bool]]:
        """The next batch: queued jobs of the same kind (inline or not), in order."""
        inline = self._queue[0][2]
        end = 1
        while end < len(self._queue) and end < _MAX_BATCH and self._queue[end][2] == inline:
            end += 1
        batch, self._queue = self._queue[:end], self._queue[end:]
        return batch

    def _settle(
        self, batch: Sequence[tuple[Job, asyncio.Future[Any], bool]], outcomes: list[Outcome]
    ) -> None:
        for (_, future, _), (ok, value) in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    async def _checkpoint(self, loop: asyncio.AbstractEventLoop) -> None:
        """Copy the WAL into the database file, on the helper thread, between two batches.

        Between batches, not beside them: a checkpoint racing the loop's
        commits never finds the WAL wholly copied, so it would never restart
        and would grow without end. Queued writes wait meanwhile; the loop
        does not. PASSIVE: it never waits for a reader (what a reader still
        needs is copied next time).
        """
        try:
            await loop.run_in_executor(self._executor, self._checkpoint_wal)
        except sqlite3.Error as exc:  # a later checkpoint (or the last close) copies it
            log.warning("wal_checkpoint_failed", error=repr(exc))

    def _checkpoint_wal(self) -> None:
        if self._helper is not None:
            self._helper.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _commit_waiting(self, jobs: list[Job]) -> list[Outcome]:
        """In the helper thread: the jobs on its connection, which waits for locks."""
        outcomes = self._commit(self._helper, jobs)
        assert outcomes is not None  # only a fallback commit gives up
        return outcomes

    @staticmethod
    def _commit(
        conn: sqlite3.Connection | None, jobs: list[Job], *, fallback: bool = False
    ) -> list[Outcome] | None:
        """All jobs in one transaction; a job that fails is undone alone.

        Every job first runs bare, no savepoint around it: a savepoint makes SQLite
        keep a copy of each page the job changes (seven 16 KB pages for an exchange,
        past the 64 KB after which it goes to a temporary file: a file created,
        written and unlinked per commit). Should one fail, the transaction is rolled
        back and the batch runs again, each job in its own savepoint, so only the
        failing one is undone; a lone job's failure needs no second run. So a job
        may run twice, its first run rolled back: jobs are plain functions of their
        arguments and the connection.

        ``fallback``: return None, having done nothing, if another connection
        holds the write lock (the caller retries where waiting is harmless).
        """
        if conn is None:
            error = RuntimeError("SqliteStore is not open")
            return [(False, error) for _ in jobs]
        begun = _begin(conn, jobs, fallback)
        if begun is not True:
            return begun
        try:
            results: list[Any] = []
            for job in jobs:
                results.append(job(conn))
            conn.execute("COMMIT")
            return [(True, result) for result in results]
        except sqlite3.Error as exc:
            if len(results) == len(jobs):
                # COMMIT failed (disk full, I/O error...): nothing is kept.
                _rollback(conn)
                return [(False, exc) for _ in jobs]
            failure: Exception = exc
        except Exception as exc:  # a job's own failure goes to its caller, not the batch
            failure = exc
        _rollback(conn)
        if len(jobs) == 1:
            return [(False, failure)]
        begun = _begin(conn, jobs, fallback)
        if begun is not True:
            return begun
        return _commit_isolated(conn, jobs)


def _begin(
    conn: sqlite3.Connection, jobs: list[Job], fallback: bool
) -> Literal[True] | list[Outcome] | None:
    """BEGIN IMMEDIATE: True, or what the batch's outcome is when it cannot begin."""
    try:
        # IMMEDIATE: take the write lock up front, so a job's lookups and
        # inserts see one state even with writers in other processes.
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        if fallback and exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY:
            return None
        # Locked past busy_timeout, disk I/O error...: nothing was done.
        return [(False, exc) for _ in jobs]
    return True


def _rollback(conn: sqlite3.Connection) -> None:
    # A failed statement may have ended the transaction (SQLite rolls back on some errors).
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _commit_isolated(conn: sqlite3.Connection, jobs: list[Job]) -> list[Outcome]:
    """In the transaction begun: each job in its own savepoint, then COMMIT."""
    outcomes: list[Outcome] = []
    try:
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
        # COMMIT failed (disk full, I/O error...): nothing is kept.
        _rollback(conn)
        return [(False, exc) for _ in jobs]
    return outcomes
