"""The SQLite store's summaries: the write job and the reads (``SqliteStore`` calls these).

Kept apart from proxy/store/sqlite.py so that file stays about exchanges; the
job runs in the writer's transaction like every other write.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from proxy.store.base import (
    SessionRef,
    Storable,
    StoredSummary,
    SummaryIn,
    chain_path_hashes,
)
from proxy.store.rows import summary_from_row

# (conn, session id, chain, path hashes, now) -> (item ids, positions inserted)
StoreChain = Callable[
    [sqlite3.Connection, int, Sequence[Storable], Sequence[str], float],
    tuple[list[int], list[int]],
]

SESSION_SUMMARIES = """
    SELECT summaries.* FROM summaries JOIN sessions ON sessions.id = summaries.session_id
    WHERE sessions.tenant = ? AND sessions.key = ? ORDER BY summaries.id
"""

_INSERT = """
    INSERT INTO summaries (session_id, covers_item_id, covers_path_hash, start_unit,
        previous_summary_id, text, facts_json, flagged_json, model, prompt_hash, usage_json,
        created_at)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (session_id, covers_path_hash, start_unit) DO NOTHING
"""

_SELECT_RANGE = (
    "SELECT * FROM summaries WHERE session_id = ? AND covers_path_hash = ? AND start_unit = ?"
)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def save_summary_job(
    store_chain: StoreChain,
    session: SessionRef,
    covered: Sequence[Storable],
    summary: SummaryIn,
    conn: sqlite3.Connection,
) -> StoredSummary:
    if not covered:
        raise ValueError("a summary must cover at least one item")
    now = time.time()
    # Created if new, but not "active": a background summary is not the client's activity.
    conn.execute(
        "INSERT INTO sessions (tenant, key, created_at, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (tenant, key) DO NOTHING",
        (session.tenant, session.key, now, now),
    )
    row = conn.execute(
        "SELECT id FROM sessions WHERE tenant = ? AND key = ?", (session.tenant, session.key)
    ).fetchone()
    session_id = int(row[0])
    hashes = chain_path_hashes([m.content_hash for m in covered])
    ids, _ = store_chain(conn, session_id, covered, hashes, now)
    conn.execute(
        _INSERT,
        (
            session_id,
            ids[-1],
            hashes[-1],
            summary.start_unit,
            summary.previous_summary_id,
            summary.text,
            _dumps(list(summary.facts)),
            _dumps(list(summary.flagged)),
            summary.model,
            summary.prompt_hash,
            None if summary.usage is None else _dumps(summary.usage),
            now,
        ),
    )
    # The row for this range: the one just inserted, or the one that was there first.
    cursor = conn.execute(_SELECT_RANGE, (session_id, hashes[-1], summary.start_unit))
    names = [d[0] for d in cursor.description]
    return summary_from_row(dict(zip(names, cursor.fetchone(), strict=True)))


def covering(
    covers: Sequence[tuple[int, str]], path_hashes: Sequence[str], limit: int
) -> list[int]:
    """Ids of the summaries whose covered item is on the chain: longest prefix, newest first."""
    position = {h: i for i, h in enumerate(path_hashes)}
    found = [(position[h], summary_id) for summary_id, h in covers if h in position]
    found.sort(reverse=True)
    return [summary_id for _, summary_id in found[:limit]]


def covering_summaries(
    summaries: Sequence[StoredSummary], path_hashes: Sequence[str], limit: int
) -> list[StoredSummary]:
    """Of a session's summaries, those on the chain (``Store.summaries_for``'s answer, for
    a store that holds them all: SQLite's memo, the in-memory fake, Redis)."""
    if not summaries:
        return []
    ids = covering([(s.id, s.covers_path_hash) for s in summaries], path_hashes, limit)
    by_id = {s.id: s for s in summaries}
    return [by_id[i] for i in ids]
