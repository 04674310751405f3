"""Migration 9 (items in fewer bytes) on a database the store made at schema version 8.

tests/store/data/schema8.sqlite was written by the store as it was before
this migration (tests/store/data/make_schema8.py says how): every item, its
recall index entries, vectors, summaries and requests must come through.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.store import sqlite
from proxy.store.base import MessageIn, SessionRef
from proxy.store.migrations import MIGRATIONS
from proxy.store.sqlite import SqliteStore
from proxy.store.sqlite_search import SqliteRecallIndex
from proxy.store.sqlite_vectors import SqliteVectorIndex
from tests.store.test_search_sqlite import fts_rows
from tests.stores import msg, req

FIXTURE = Path(__file__).parent / "data" / "schema8.sqlite"
ALICE, BOB, CAROL = (
    SessionRef("t1", "alice"),
    SessionRef("t2", "bob"),
    SessionRef("t1", "resp:resp_1"),
)

ITEM_COLUMNS = (
    "id, session_id, parent_id, path_hash, content_hash, role, token_count, status,"
    " message_json, created_at, pos"
)
# The same columns read from a migrated table, the hashes as the hex they were.
MIGRATED_COLUMNS = ITEM_COLUMNS.replace("path_hash", "lower(hex(path_hash))").replace(
    "content_hash", "lower(hex(content_hash))"
)


def raw(path: Path, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(query, params).fetchall()


@pytest.fixture
def old(tmp_path: Path) -> Path:
    path = tmp_path / "old.sqlite"
    shutil.copy(FIXTURE, path)
    assert raw(path, "SELECT max(version) FROM schema_migrations") == [(8,)]
    return path


def everything_but_items(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    tables = ("sessions", "requests", "responses", "summaries", "item_vectors")
    return {t: raw(path, f"SELECT * FROM {t} ORDER BY rowid") for t in tables}


async def test_every_item_comes_through_as_it_was_with_its_hashes_in_16_bytes(old: Path) -> None:
    items = raw(old, f"SELECT {ITEM_COLUMNS} FROM items ORDER BY id")
    others = everything_but_items(old)
    index = fts_rows(old)
    assert len(items) == 13 and {r[7] for r in items} == {"complete", "incomplete"}
    store = SqliteStore(old)
    await store.open()
    try:
        assert raw(old, "SELECT max(version) FROM schema_migrations") == [(len(MIGRATIONS),)]
        assert raw(old, f"SELECT {MIGRATED_COLUMNS} FROM items ORDER BY id") == items
        assert everything_but_items(old) == others
        assert fts_rows(old) == index
        assert raw(old, "SELECT DISTINCT typeof(path_hash), typeof(content_hash) FROM items") == [
            ("blob", "blob")
        ]
        # A role is stored only where the message has none of its own (Responses items).
        kinds = raw(old, "SELECT kind FROM items WHERE kind IS NOT NULL ORDER BY id")
        assert kinds == [("function_call",), ("function_call_output",)]
        # The store reads them back as before: every StoredItem field.
        chains = [await store.history(s) for s in (ALICE, BOB)]
        chains.append(await store.response_chain("t1", "resp_1"))
        fields = ("id", "session_id", "parent_id", "path_hash", "content_hash", "role")
        fields += ("token_count", "status", "created_at")
        read = [tuple(getattr(i, f) for f in fields) for chain in chains for i in chain]
        assert sorted(read) == [(*r[:8], r[9]) for r in items]
        messages = {i.id: i.message for chain in chains for i in chain}
        assert messages == {r[0]: orjson.loads(r[8]) for r in items}
        # The recall index and the vectors still name the same items.
        hits = await SqliteRecallIndex(store.fetch).search(ALICE, ["lyon"], limit=3)
        assert [h.position for h in hits] == [1]
        vectors = await SqliteVectorIndex(store.fetch, store.write).vectors(ALICE)
        assert [(v.item_id, v.content_hash) for v in vectors.rows] == [
            (2, items[1][4]),
            (3, items[2][4]),
        ]
    finally:
        await store.close()


async def test_the_migrated_store_goes_on_as_before_and_never_reuses_an_id(old: Path) -> None:
    store = SqliteStore(old)
    await store.open()
    try:
        async with store._conn.execute("PRAGMA foreign_keys") as cursor:
            assert tuple(await cursor.fetchone()) == (1,)  # back on after the rebuild
        history = await store.history(ALICE)
        resent = [MessageIn(i.message, i.content_hash, i.role, i.token_count) for i in history[:4]]
        await store.record_exchange(ALICE, [*resent, msg("user", "thanks")], None, req())
        after = raw(old, "SELECT id FROM items WHERE session_id = 1 ORDER BY id")
        # The resent four found by their path hashes; the new one after the counter (15).
        assert after == [(1,), (2,), (3,), (4,), (5,), (16,)]
        assert [i.id for i in await store.history(ALICE)] == [1, 2, 3, 4, 16]
        # Deleting goes through the rebuilt table's references: vectors, index rows.
        assert await store.delete_session(ALICE)
        assert raw(old, "SELECT count(*) FROM item_vectors") == [(0,)]
        assert not set(fts_rows(old)) & {1, 2, 3, 4, 5, 16}
        assert [i.role for i in await store.history(BOB)] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
    finally:
        await store.close()


async def test_a_status_it_cannot_keep_fails_the_migration_and_leaves_version_8(
    old: Path,
) -> None:
    with sqlite3.connect(old) as conn:
        conn.execute("UPDATE items SET status = 'cancelled' WHERE id = 5")
    before = raw(old, f"SELECT {ITEM_COLUMNS} FROM items ORDER BY id")
    store = SqliteStore(old)
    with pytest.raises(sqlite3.IntegrityError):
        await store.open()
    assert raw(old, "SELECT max(version) FROM schema_migrations") == [(8,)]
    assert raw(old, f"SELECT {ITEM_COLUMNS} FROM items ORDER BY id") == before
    assert raw(old, "SELECT count(*) FROM item_vectors") == [(2,)]


async def test_a_new_database_takes_the_store_page_size_and_an_old_one_keeps_its_own(
    old: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite, "PAGE_SIZE", 8192)
    for path in (tmp_path / "new.sqlite", old):
        store = SqliteStore(path)
        await store.open()
        await store.close()
    assert raw(tmp_path / "new.sqlite", "PRAGMA page_size") == [(8192,)]
    assert raw(old, "PRAGMA page_size") == [(4096,)]
