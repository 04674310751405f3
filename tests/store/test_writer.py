"""The SQLite writer: commits on the event loop, waits and checkpoints on its helper thread."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from proxy.store import writer as writer_module
from proxy.store.migrations import MIGRATIONS
from proxy.store.writer import SqliteWriter


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "store.sqlite"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(MIGRATIONS[0])
    return path


@pytest.fixture
async def writer(db_path: Path) -> AsyncIterator[SqliteWriter]:
    w = SqliteWriter(db_path, busy_timeout_ms=5000)
    await w.open()
    yield w
    await w.close()


def insert_session(key: str) -> writer_module.Job:
    def job(conn: sqlite3.Connection) -> int:
        conn.execute(
            "INSERT INTO sessions (tenant, key, created_at, updated_at) VALUES ('t', ?, 0, 0)",
            (key,),
        )
        return threading.get_ident()

    return job


def keys(db_path: Path) -> list[str]:
    with closing(sqlite3.connect(db_path)) as conn:
        return [row[0] for row in conn.execute("SELECT key FROM sessions ORDER BY id")]


def wal_frames(db_path: Path) -> int:
    """Frames in the WAL since it last restarted (what a checkpoint would have to copy)."""
    with closing(sqlite3.connect(db_path)) as conn:
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(frames)


async def test_writes_commit_on_the_loops_thread_and_long_jobs_on_the_helpers(writer, db_path):
    loop_thread = threading.get_ident()
    inline, helper = await asyncio.gather(
        writer.submit(insert_session("a")), writer.submit(insert_session("b"), inline=False)
    )
    assert inline == loop_thread
    assert helper != loop_thread
    assert keys(db_path) == ["a", "b"]


async def test_jobs_commit_in_the_order_submitted_whichever_thread_runs_them(writer, db_path):
    names = [f"s{i}" for i in range(12)]
    await asyncio.gather(
        *(writer.submit(insert_session(k), inline=i % 3 != 0) for i, k in enumerate(names))
    )
    assert keys(db_path) == names


async def test_a_database_locked_by_another_process_is_waited_for_off_the_loop(writer, db_path):
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    running = asyncio.create_task(ticker())
    asyncio.get_running_loop().call_later(0.3, other.execute, "COMMIT")
    try:
        ran_on = await writer.submit(insert_session("late"))
    finally:
        running.cancel()
        other.close()
    assert ran_on != threading.get_ident()  # retried on the helper, which waits for the lock
    assert ticks >= 10  # and the loop kept serving meanwhile
    assert keys(db_path) == ["late"]


def touch_sessions(key: str, previous: str) -> writer_module.Job:
    def job(conn: sqlite3.Connection) -> None:
        insert_session(key)(conn)
        conn.execute("UPDATE sessions SET updated_at = 1 WHERE key = ?", (previous,))

    return job


async def test_the_helper_checkpoints_so_the_wal_stops_growing_under_load(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def frames_after_load(checkpoint_every: int) -> int:
        monkeypatch.setattr(writer_module, "_CHECKPOINT_COMMITS", checkpoint_every)
        w = SqliteWriter(db_path, busy_timeout_ms=5000)
        await w.open()
        try:
            # Batches keep committing while the helper checkpoints.
            for batch in range(80):
                names = [f"{checkpoint_every}-{batch}-{i}" for i in range(16)]
                await asyncio.gather(*(w.submit(touch_sessions(k, f"{k}-x")) for k in names))
                await asyncio.sleep(0.001)
            return wal_frames(db_path)
        finally:
            await w.close()

    never = await frames_after_load(10**9)
    often = await frames_after_load(20)
    # The loop's connection never checkpoints by itself; the helper's checkpoints,
    # between batches, let the WAL restart (racing the commits, they would not).
    assert often < never / 3


async def test_a_write_to_a_closed_writer_fails_its_future_without_raising(db_path):
    w = SqliteWriter(db_path, busy_timeout_ms=5000)
    await w.open()
    await w.close()
    future = w.enqueue(insert_session("x"))
    with pytest.raises(RuntimeError, match="not open"):
        await future


async def test_a_lone_write_a_client_waits_for_does_not_linger_for_company(
    writer, db_path, monkeypatch
):
    monkeypatch.setattr(writer_module, "_BUSY_S", 60.0)  # every batch counts as "moments ago"
    await writer.enqueue(insert_session("a"))
    # Right after a batch: a write nobody waits for lingers (group commit under load)...
    await writer.enqueue(insert_session("b"))
    assert writer.lingers == 1
    # ...one a client waits for, requests coming one at a time, does not.
    await writer.enqueue(insert_session("c"), urgent=True)
    assert writer.lingers == 1
    # Several at once (batches of more than one): it lingers again, for them all.
    await asyncio.gather(*(writer.enqueue(insert_session(k)) for k in "de"))
    await writer.enqueue(insert_session("f"), urgent=True)
    assert writer.lingers == 3
    assert keys(db_path) == list("abcdef")


async def lingering_write(writer: SqliteWriter, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Session "b" queued right after "a" was written, lingering (60 s here)."""
    monkeypatch.setattr(writer_module, "_BUSY_S", 60.0)
    monkeypatch.setattr(writer_module, "_LINGER_S", 60.0)
    await writer.enqueue(insert_session("a"))
    lingering = writer.enqueue(insert_session("b"))
    await asyncio.sleep(0.05)
    assert not lingering.done() and writer.lingers == 1
    return lingering


async def test_a_linger_ends_once_a_batchs_worth_is_queued_and_on_close(
    writer, db_path, monkeypatch
):
    lingering = await lingering_write(writer, monkeypatch)
    # Company enough: the batch goes without waiting out the linger.
    more = [writer.enqueue(insert_session(f"c{i}")) for i in range(writer_module._BATCH_TARGET)]
    await asyncio.wait_for(asyncio.gather(lingering, *more), 5)
    last = writer.enqueue(insert_session("d"))
    await asyncio.sleep(0.05)
    assert not last.done() and writer.lingers == 2
    await asyncio.wait_for(writer.close(), 5)  # nothing queued is left behind, and no wait
    assert last.done() and len(keys(db_path)) == 3 + writer_module._BATCH_TARGET


async def test_a_job_a_client_waits_for_cuts_a_long_linger_short(writer, db_path, monkeypatch):
    lingering = await lingering_write(writer, monkeypatch)
    # history: server or Responses: the client's answer waits for this commit.
    await asyncio.wait_for(writer.enqueue(insert_session("c"), urgent=True), 5)
    assert lingering.done() and keys(db_path) == ["a", "b", "c"]


def failing(key: str) -> writer_module.Job:
    """Inserts its session, then fails: what it wrote must be undone, and only that."""

    def job(conn: sqlite3.Connection) -> None:
        insert_session(key)(conn)
        raise ValueError(f"job {key} failed")

    return job


async def test_a_failing_job_is_undone_alone_and_the_rest_of_its_batch_kept(writer, db_path):
    futures = [
        writer.enqueue(insert_session("a")),
        writer.enqueue(failing("b")),
        writer.enqueue(insert_session("c")),
    ]
    done = await asyncio.gather(*futures, return_exceptions=True)
    assert isinstance(done[1], ValueError)
    assert done[0] == done[2] == threading.get_ident()
    assert keys(db_path) == ["a", "c"]
    # A lone failing job: nothing of it is kept, and the writer goes on.
    with pytest.raises(ValueError, match="job d failed"):
        await writer.enqueue(failing("d"))
    await writer.enqueue(insert_session("e"))
    assert keys(db_path) == ["a", "c", "e"]


async def test_jobs_that_succeed_commit_without_a_savepoint_each(writer, db_path):
    # A savepoint copies every page a job changes (with 16 KB pages, an exchange's
    # copies went to a temporary file per commit): only a failure pays for one.
    statements: list[str] = []
    assert writer._conn is not None
    writer._conn.set_trace_callback(statements.append)
    await asyncio.gather(writer.enqueue(insert_session("a")), writer.enqueue(insert_session("b")))
    assert not [s for s in statements if "SAVEPOINT" in s]
    await asyncio.gather(
        writer.enqueue(insert_session("c")), writer.enqueue(failing("d")), return_exceptions=True
    )
    assert [s for s in statements if "SAVEPOINT" in s] == ["SAVEPOINT job", "SAVEPOINT job"]
    assert keys(db_path) == ["a", "b", "c"]
