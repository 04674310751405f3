"""What a deletion leaves behind in a SQLite file, and how the store removes it.

Deleting a row is not enough for the words to leave the disk: SQLite keeps a
freed page's old bytes (and a cell's, in a page that stays), FTS5 keeps a
deleted document's terms in its segment blobs (``items_fts_data``,
``items_fts_idx``) until a merge rewrites them, and the WAL keeps the pages
written last until a checkpoint truncates it. So the store's deletions
(sessions, responses, the TTL's sweep) do three things:

- ``PRAGMA secure_delete = ON`` on the writer's connections: freed space is
  overwritten with zeros (proxy/store/writer.py);
- FTS5's ``secure-delete`` option (SQLite 3.44+) makes each ``'delete'``
  remove the document's entries from the segments at once; on an older SQLite
  the deleting job ends with an ``'optimize'``, which merges every segment into
  one without the deleted terms (it rewrites the whole index: a cost paid per
  deletion, not per request);
- after the deleting transaction commits, a ``TRUNCATE`` checkpoint copies the
  zeroed pages into the file and empties the WAL.

The FTS option is set when the store opens, not by a migration: a migration
runs once whatever the version, and a database first migrated under an older
SQLite should get the option once it is opened by a newer one.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from proxy.telemetry.logging import get_logger

log = get_logger()
_T = TypeVar("_T")

# FTS5's secure-delete option arrived in SQLite 3.44.0.
FTS_SECURE_DELETE = sqlite3.sqlite_version_info >= (3, 44, 0)

ENABLE_FTS_SECURE_DELETE = "INSERT INTO items_fts (items_fts, rank) VALUES ('secure-delete', 1)"


def purging(job: Callable[[sqlite3.Connection], _T], conn: sqlite3.Connection) -> _T:
    """Run a deleting job, then (if it deleted anything) purge the recall index's leftovers.

    In the job's own transaction: the deleted terms leave the index in the same
    commit that deletes the rows, or not at all.
    """
    result = job(conn)
    if result and not FTS_SECURE_DELETE:
        conn.execute("INSERT INTO items_fts (items_fts) VALUES ('optimize')")
    return result


async def truncate_wal(path: Path, busy_timeout_ms: int) -> None:
    """Copy the WAL into the file and empty it, on a thread; if a reader keeps it,
    proxy/store/writer.py's idle truncation tries again."""
    if not await asyncio.to_thread(_truncate_wal, path, busy_timeout_ms):
        log.warning("wal_truncate_blocked", path=str(path))


def vacuum(path: Path, busy_timeout_ms: int) -> None:
    """``ctxproxy sessions purge``: the index merged, the file rewritten, the WAL emptied."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        conn.execute("PRAGMA secure_delete = ON")
        conn.execute("INSERT INTO items_fts (items_fts) VALUES ('optimize')")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()


def _truncate_wal(path: Path, busy_timeout_ms: int) -> bool:
    # A connection of its own: SQLite's locks order it with the writer's.
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return not busy
    finally:
        conn.close()
