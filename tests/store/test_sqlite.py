"""What only the SQLite store promises: WAL, migrations, durability, rollback, other processes."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.store import sqlite_jobs
from proxy.store.base import MessageIn, RequestRecord, SessionRef, SummaryIn, chain_path_hashes
from proxy.store.migrations import MIGRATIONS, migrate, split_statements
from proxy.store.sqlite import SqliteStore
from tests.stores import ALICE, msg, req

SYSTEM = msg("system", "be brief")
U1, A1, U2 = msg("user", "hi"), msg("assistant", "hello"), msg("user", "weather?")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.sqlite"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(db_path)
    await s.open()
    yield s
    await s.close()


def raw(db_path: Path, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the file directly, as another process would."""
    with sqlite3.connect(db_path) as conn:
        return conn.execute(query, params).fetchall()


async def test_connection_uses_wal_normal_sync_and_foreign_keys(
    store: SqliteStore, db_path: Path
) -> None:
    assert raw(db_path, "PRAGMA journal_mode") == [("wal",)]
    conn = store._conn  # the per-connection pragmas can only be read on that connection
    for pragma, expected in [("synchronous", 1), ("foreign_keys", 1), ("busy_timeout", 5000)]:
        async with conn.execute(f"PRAGMA {pragma}") as cursor:
            row = await cursor.fetchone()
            assert row is not None and tuple(row) == (expected,), pragma


async def test_migrations_are_recorded_once_and_reopening_applies_nothing(
    store: SqliteStore, db_path: Path
) -> None:
    first = raw(db_path, "SELECT version, applied_at FROM schema_migrations ORDER BY version")
    assert [v for v, _ in first] == list(range(1, len(MIGRATIONS) + 1))

    again = SqliteStore(db_path)
    await again.open()
    assert await migrate(again._conn) == []
    await again.close()
    assert (
        raw(db_path, "SELECT version, applied_at FROM schema_migrations ORDER BY version") == first
    )


def test_split_statements_keeps_semicolons_inside_comments_strings_and_triggers() -> None:
    script = """
        CREATE TABLE t (x TEXT DEFAULT 'a;b'); -- trailing; comment
        CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = 'c;'; END;
        SELECT 1
    """
    statements = split_statements(script)

    assert len(statements) == 3  # the comment rides along with the trigger
    assert statements[0] == "CREATE TABLE t (x TEXT DEFAULT 'a;b');"
    assert statements[1].endswith("END;") and "'c;'" in statements[1]
    assert statements[2] == "SELECT 1"  # no semicolon, still kept
    conn = sqlite3.connect(":memory:")
    for statement in statements:
        conn.execute(statement)


async def test_data_survives_close_and_reopen(store: SqliteStore, db_path: Path) -> None:
    first = await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    await store.close()

    reopened = SqliteStore(db_path)
    await reopened.open()
    try:
        assert [h.message for h in await reopened.history(ALICE)] == [
            m.message for m in (SYSTEM, U1, A1)
        ]
        again = await reopened.record_exchange(ALICE, [SYSTEM, U1, A1, U2], None, req())
        assert first is not None and again is not None
        assert again.new_messages == 1 and again.item_ids[:3] == [*first.item_ids, first.reply_id]
    finally:
        await reopened.close()


async def test_failure_after_items_were_inserted_rolls_back_everything(
    store: SqliteStore, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    tables = "SELECT (SELECT COUNT(*) FROM items), (SELECT COUNT(*) FROM requests)"
    session_row = "SELECT head_item_id, updated_at FROM sessions"
    before = raw(db_path, tables), raw(db_path, session_row)
    seen_inside: list[tuple[Any, ...]] = []

    def explode(conn: Any, *args: Any, **kwargs: Any) -> None:
        seen_inside.append(conn.execute("SELECT COUNT(*) FROM items").fetchone())
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(sqlite_jobs, "insert_request", explode)
    bob = SessionRef("tenant-b", "new")
    with pytest.raises(RuntimeError, match="disk on fire"):
        await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], msg("assistant", "x"), req())
    with pytest.raises(RuntimeError, match="disk on fire"):
        await store.record_exchange(bob, [U1], A1, req(tenant=bob.tenant))
    assert raw(db_path, "SELECT key FROM sessions") == [(ALICE.key,)]

    # Both times the new items (3 stored + 2) were in when the failure struck.
    assert [row[0] for row in seen_inside] == [5, 5]
    assert (raw(db_path, tables), raw(db_path, session_row)) == before
    monkeypatch.undo()
    # Nothing about the rolled-back items lingers.
    retry = await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], msg("assistant", "x"), req())
    assert retry is not None and retry.new_messages == 1
    assert len(await store.history(ALICE)) == 5
    assert raw(db_path, "SELECT COUNT(*) FROM items") == [(5,)]


async def test_failed_commit_rolls_back_and_a_retry_stores_everything(
    store: SqliteStore, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = store._writer
    assert writer is not None
    real = writer._conn

    class FailingCommit:
        """The writer's connection, except that COMMIT fails as a full disk would."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error")
            return real.execute(sql, *args)

    monkeypatch.setattr(writer, "_conn", FailingCommit())
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    monkeypatch.undo()

    assert raw(db_path, "SELECT COUNT(*) FROM items") == [(0,)]
    result = await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    assert result is not None and result.new_messages == 2
    assert raw(db_path, "SELECT COUNT(*) FROM items") == [(3,)]


async def test_a_failing_exchange_in_a_group_commit_leaves_the_others_stored(
    store: SqliteStore, db_path: Path
) -> None:
    duplicate = req()
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, duplicate)
    # Submitted together, these share one transaction; one of them reuses a request id.
    results = await asyncio.gather(
        store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], msg("assistant", "ok1"), req()),
        store.record_exchange(ALICE, [SYSTEM, U1, A1, msg("user", "bad")], None, duplicate),
        store.record_exchange(SessionRef("tenant-b", "k"), [U1], A1, req(tenant="tenant-b")),
        return_exceptions=True,
    )
    assert isinstance(results[1], ValueError)
    assert not isinstance(results[0], BaseException) and not isinstance(results[2], BaseException)
    contents = [row[0] for row in raw(db_path, "SELECT message_json FROM items")]
    assert not any('"bad"' in c for c in contents)
    assert any('"ok1"' in c for c in contents)
    assert raw(db_path, "SELECT COUNT(*) FROM sessions") == [(2,)]


async def test_items_keep_the_raw_message_json_and_queryable_columns(
    store: SqliteStore, db_path: Path
) -> None:
    tool_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
        "extra": {"unicode": "héllo ☃", "n": 1.5},
    }
    stored = MessageIn(tool_call, "hash-1", "assistant", token_count=17, status="incomplete")
    await store.record_exchange(ALICE, [stored], None, req())

    rows = raw(db_path, "SELECT message_json, content_hash, role, token_count, status FROM items")
    assert len(rows) == 1
    message_json, *columns = rows[0]
    assert orjson.loads(message_json) == tool_call
    assert columns == ["hash-1", "assistant", 17, "incomplete"]


async def test_prefix_lookup_spans_several_chunks(db_path: Path) -> None:
    long = [msg("user", f"m{i}") for i in range(3 * sqlite_jobs.CHUNK + 7)]
    writer = SqliteStore(db_path)
    await writer.open()
    await writer.record_exchange(ALICE, long, None, req())
    await writer.close()

    fresh = SqliteStore(db_path)  # no cached ids: every hash goes through the SELECT
    await fresh.open()
    try:
        result = await fresh.record_exchange(ALICE, [*long, U2], None, req())
        assert result is not None and result.new_messages == 1
    finally:
        await fresh.close()


async def test_two_stores_on_one_file_write_concurrently_without_duplicates(
    db_path: Path,
) -> None:
    stores = [SqliteStore(db_path), SqliteStore(db_path)]
    for s in stores:
        await s.open()
    prefix = [SYSTEM, U1, A1]
    try:
        results = await asyncio.gather(
            *(
                stores[i % 2].record_exchange(ALICE, [*prefix, msg("user", f"q{i}")], None, req())
                for i in range(20)
            )
        )
    finally:
        for s in stores:
            await s.close()

    assert len({tuple(r.item_ids[:3]) for r in results if r is not None}) == 1
    assert raw(db_path, "SELECT COUNT(*) FROM sessions") == [(1,)]
    assert raw(db_path, "SELECT COUNT(*), COUNT(DISTINCT path_hash) FROM items") == [(23, 23)]
    assert raw(db_path, "SELECT COUNT(*) FROM requests") == [(20,)]


async def test_writer_waits_for_another_connections_lock_within_busy_timeout(
    store: SqliteStore, db_path: Path
) -> None:
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    asyncio.get_running_loop().call_later(0.2, other.execute, "COMMIT")
    try:
        result = await store.record_exchange(ALICE, [U1], A1, req())
    finally:
        other.close()

    assert result is not None and result.new_messages == 1


async def test_writer_gives_up_when_the_lock_outlasts_busy_timeout(db_path: Path) -> None:
    impatient = SqliteStore(db_path, busy_timeout=0.05)
    await impatient.open()
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await impatient.record_exchange(ALICE, [U1], A1, req())
    finally:
        other.execute("ROLLBACK")
        other.close()
    # The failed attempt left the connection usable.
    assert await impatient.record_exchange(ALICE, [U1], A1, req()) is not None
    await impatient.close()


async def test_session_deleted_by_another_store_is_recreated_from_scratch(
    db_path: Path,
) -> None:
    a, b = SqliteStore(db_path), SqliteStore(db_path)
    await a.open()
    await b.open()
    try:
        first = await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
        assert await b.delete_session(ALICE)
        again = await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
        assert first is not None and again is not None
        assert again.new_messages == 2
        assert set(again.item_ids).isdisjoint(first.item_ids)  # ids are never reused
        assert [h.id for h in await b.history(ALICE)] == [*again.item_ids, again.reply_id]
    finally:
        await a.close()
        await b.close()


async def test_cancelled_caller_does_not_interrupt_the_write(db_path: Path) -> None:
    store = SqliteStore(db_path)
    await store.open()
    task = asyncio.create_task(store.record_exchange(ALICE, [SYSTEM, U1], A1, req()))
    await asyncio.sleep(0)  # the write has started
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await store.close()  # waits for the write in flight

    assert raw(db_path, "SELECT COUNT(*) FROM items") == [(3,)]
    assert raw(db_path, "SELECT COUNT(*) FROM requests") == [(1,)]


async def test_using_a_closed_store_is_an_error(db_path: Path) -> None:
    s = SqliteStore(db_path)
    with pytest.raises(RuntimeError, match="not open"):
        await s.history(ALICE)
    record: RequestRecord = req()
    await s.open()
    await s.close()
    with pytest.raises(RuntimeError, match="not open"):
        await s.record_exchange(ALICE, [U1], None, record)


def counting_reads(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every query the store sends its read connection, recorded."""
    queries: list[str] = []
    fetch = store._fetch

    async def recording(query: str, params: tuple[Any, ...]) -> list[sqlite3.Row]:
        queries.append(query)
        return await fetch(query, params)

    monkeypatch.setattr(store, "_fetch", recording)
    return queries


async def test_summaries_are_read_once_per_session_until_a_write_changes_them(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    paths = chain_path_hashes([SYSTEM.content_hash, U1.content_hash, A1.content_hash])
    reads = counting_reads(store, monkeypatch)
    assert await store.summaries_for(ALICE, paths) == []
    assert await store.summaries_for(ALICE, paths) == []
    first = len(reads)  # none found is remembered too: no read for a request needing none
    # A summary saved is added to what the memo holds: found, without reading again.
    saved = await store.save_summary(ALICE, [SYSTEM, U1], SummaryIn(text="greeting"))
    assert [s.id for s in await store.summaries_for(ALICE, paths)] == [saved.id]
    later = await store.save_summary(ALICE, [SYSTEM, U1, A1], SummaryIn(text="and more"))
    again = await store.save_summary(ALICE, [SYSTEM, U1, A1], SummaryIn(text="the same range"))
    assert again.id == later.id  # the range's first summary stays
    assert [s.id for s in await store.summaries_for(ALICE, paths)] == [later.id, saved.id]
    assert len(reads) == first
    assert [s.id for s in await store.summaries(ALICE)] == [saved.id, later.id]
    assert await store.delete_session(ALICE)
    assert await store.summaries_for(ALICE, paths) == []


async def delete_elsewhere(db_path: Path) -> None:
    """ALICE deleted by another process (`python -m proxy sessions delete` while the proxy runs)."""
    other = SqliteStore(db_path)
    await other.open()
    try:
        assert await other.delete_session(ALICE)
    finally:
        await other.close()


async def test_a_session_another_process_deleted_loses_its_memoized_summaries_at_the_next_write(
    store: SqliteStore, db_path: Path
) -> None:
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    paths = chain_path_hashes([SYSTEM.content_hash, U1.content_hash, A1.content_hash])
    await store.save_summary(ALICE, [SYSTEM, U1], SummaryIn(text="greeting"))
    assert len(await store.summaries_for(ALICE, paths)) == 1
    await delete_elsewhere(db_path)
    # The session made again by the next exchange: another id, so the memo is dropped.
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    assert await store.summaries_for(ALICE, paths) == []


async def test_the_items_version_moves_only_when_a_write_may_change_the_sessions_items(
    store: SqliteStore, db_path: Path
) -> None:
    # Unknown before this process saw an exchange of it: nothing may be memoized.
    assert store.items_version(ALICE) is None
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    first = store.items_version(ALICE)
    assert first is not None
    # The same history resent, with the same reply: no new item, the same version.
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    await store.record_exchange(ALICE, [SYSTEM], None, req())
    assert store.items_version(ALICE) == first
    # A new message, a new reply: each a new version, never one seen before.
    await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], None, req())
    second = store.items_version(ALICE)
    assert second not in (None, first)
    await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], msg("assistant", "sunny"), req())
    third = store.items_version(ALICE)
    assert third not in (None, first, second)
    # A summary stores the items it covers; a delete removes them.
    await store.save_summary(ALICE, [SYSTEM, U1], SummaryIn(text="greeting"))
    assert store.items_version(ALICE) is None
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    fourth = store.items_version(ALICE)
    assert fourth not in (None, first, second, third)
    assert await store.delete_session(ALICE)
    assert store.items_version(ALICE) is None
    # Deleted by another process: the next exchange is to another session id.
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    fifth = store.items_version(ALICE)
    await delete_elsewhere(db_path)
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    assert store.items_version(ALICE) not in (None, first, second, third, fourth, fifth)


async def test_a_summary_read_overtaken_by_a_write_is_not_remembered(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    paths = chain_path_hashes([SYSTEM.content_hash, U1.content_hash])
    release = asyncio.Event()
    summaries = store.summaries

    async def slow(session: SessionRef) -> Any:
        found = await summaries(session)  # read before the write commits...
        await release.wait()  # ...and handed back after it did
        return found

    monkeypatch.setattr(store, "summaries", slow)
    early = asyncio.ensure_future(store.summaries_for(ALICE, paths))
    await asyncio.sleep(0.05)
    saved = await store.save_summary(ALICE, [SYSTEM, U1], SummaryIn(text="greeting"))
    release.set()
    assert await early == []
    assert [s.id for s in await store.summaries_for(ALICE, paths)] == [saved.id]
