"""The SQLite recall index: the migrations index existing databases, rows go with their items."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.store.base import MessageIn, SessionRef
from proxy.store.migrations import MIGRATIONS, split_statements
from proxy.store.search_text import search_text
from proxy.store.sqlite import SqliteStore
from proxy.store.sqlite_search import SqliteRecallIndex, words
from tests.store.test_search_contract import TEXTS, conversation
from tests.stores import ALICE, req

SHAPES: list[dict[str, Any]] = [
    {"role": "user", "content": "plain text about Lyon"},
    {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "image_url"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "find", "arguments": '{"q":1}'}}
        ],
    },
    {"type": "function_call", "name": "lookup", "arguments": '{"id": 7}', "call_id": "x"},
    {"type": "function_call_output", "call_id": "x", "output": "found seven"},
    {"type": "reasoning", "summary": []},
]


def fts_rows(path: Path) -> dict[int, frozenset[str]]:
    """The rows the index holds, each as its terms (it keeps rowids only, no text)."""
    con = sqlite3.connect(path)
    try:
        con.execute("CREATE VIRTUAL TABLE temp.words USING fts5vocab (main, items_fts, instance)")
        rows = con.execute("SELECT doc, term FROM temp.words").fetchall()
    finally:
        con.close()
    out: dict[int, set[str]] = {}
    for rowid, term in rows:
        out.setdefault(rowid, set()).add(term)
    return {k: frozenset(v) for k, v in out.items()}


def forget_index(path: Path) -> None:
    """Make the database one from before the recall index (schema version 4)."""
    con = sqlite3.connect(path)
    try:
        con.execute("DROP TRIGGER items_fts_delete")
        con.execute("DROP TABLE items_fts")
        # And before what came after it (6: item_vectors; 7: the index over a view).
        con.execute("DROP TABLE IF EXISTS item_vectors")
        con.execute("DROP VIEW IF EXISTS items_fts_source")
        con.execute("ALTER TABLE items DROP COLUMN pos")
        con.execute("DELETE FROM schema_migrations WHERE version >= 5")
        con.commit()
    finally:
        con.close()


async def test_the_migration_indexes_an_existing_database_like_the_writer_does(tmp_path: Path):
    path = tmp_path / "old.sqlite"
    store = SqliteStore(path)
    await store.open()
    shapes = [MessageIn(m, hashlib.sha256(orjson.dumps(m)).hexdigest(), "user", 1) for m in SHAPES]
    await store.record_exchange(ALICE, conversation(), None, req())
    await store.record_exchange(SessionRef("t2", "k"), shapes, None, req("t2"))
    await store.close()
    written = fts_rows(path)
    forget_index(path)
    store = SqliteStore(path)
    await store.open()
    try:
        assert fts_rows(path) == written
        hits = await SqliteRecallIndex(store.fetch).search(ALICE, ["lyon"], limit=3)
        assert [h.position for h in hits] == [2]
    finally:
        await store.close()
    assert len(written) == len(TEXTS) + len([m for m in SHAPES if search_text(m)])


async def test_index_rows_are_deleted_with_their_session(tmp_path: Path):
    path = tmp_path / "s.sqlite"
    store = SqliteStore(path)
    await store.open()
    try:
        await store.record_exchange(ALICE, conversation(), None, req())
        assert len(fts_rows(path)) == len(TEXTS)
        await store.delete_session(ALICE)
        assert fts_rows(path) == {}
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def opened(path: Path) -> AsyncIterator[SqliteStore]:
    """An open SQLite store in ``path``, closed after."""
    s = SqliteStore(path / "s.sqlite")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def test_statistics_kept_between_searches_score_as_a_fresh_count(tmp_path: Path):
    # The index keeps each session's totals and common terms between searches and
    # counts only what was added since: its hits and scores are a fresh index's.
    async with opened(tmp_path) as store:
        kept = SqliteRecallIndex(store.fetch)
        await store.record_exchange(ALICE, conversation(), None, req())
        await kept.search(ALICE, ["order", "lyon"], limit=5)
        more = [*TEXTS, "Lyon again: the order is late.", "Sorry about the order."] * 3
        await store.record_exchange(ALICE, conversation(more), None, req())
        for terms in (["order", "lyon"], ["late", "painting"], ["order"]):
            again = await kept.search(ALICE, terms, limit=30)
            fresh = await SqliteRecallIndex(store.fetch).search(ALICE, terms, limit=30)
            assert again == fresh and again


async def test_a_session_deleted_and_made_again_is_counted_afresh(tmp_path: Path):
    async with opened(tmp_path) as store:
        index = SqliteRecallIndex(store.fetch)
        await store.record_exchange(ALICE, conversation(TEXTS * 4), None, req())
        assert await index.search(ALICE, ["lyon"], limit=10)
        await store.delete_session(ALICE)
        await store.record_exchange(ALICE, conversation(["Lyon is lovely.", "It is."]), None, req())
        hits = await index.search(ALICE, ["lyon"], limit=10)
        assert hits == await SqliteRecallIndex(store.fetch).search(ALICE, ["lyon"], limit=10)
        assert [h.position for h in hits] == [0]


async def test_a_query_of_common_words_only_ranks_by_the_rarest_every_time(tmp_path: Path):
    # Words in most of a long session are skipped when rarer ones are there and
    # remembered as common; with nothing rarer they are still fetched and ranked.
    async with opened(tmp_path) as store:
        index = SqliteRecallIndex(store.fetch)
        texts = [f"the order {i} is shipped" for i in range(120)] + ["the order is lost"]
        await store.record_exchange(ALICE, conversation(texts), None, req())
        rare = await index.search(ALICE, ["order", "lost"], limit=3)
        assert [h.position for h in rare][:1] == [120]
        first = await index.search(ALICE, ["order", "shipped"], limit=3)
        second = await index.search(ALICE, ["order", "shipped"], limit=3)
        assert first == second and len(first) == 3


def downgrade(path: Path, version: int) -> None:
    """Make the database one of schema ``version`` (6 or 7): the index as it was then."""
    con = sqlite3.connect(path)
    try:
        items = con.execute("SELECT id, session_id, pos, message_json FROM items").fetchall()
        con.execute("DROP TRIGGER items_fts_delete")
        con.execute("DROP TABLE items_fts")
        con.execute("DROP VIEW items_fts_source")
        if version == 7:
            for statement in split_statements(MIGRATIONS[6]):
                if statement.startswith(("CREATE", "INSERT")):
                    con.execute(statement)
        else:  # 6: its own copy of the text (as migration 5 made it)
            con.execute(
                "CREATE VIRTUAL TABLE items_fts USING fts5"
                " (scope, body, pos UNINDEXED, tokenize = 'porter unicode61')"
            )
            con.executemany(
                "INSERT INTO items_fts (rowid, scope, body, pos) VALUES (?, ?, ?, ?)",
                [
                    (k, f"s{sid}", search_text(orjson.loads(m)), pos)
                    for k, sid, pos, m in items
                    if search_text(orjson.loads(m))
                ],
            )
            con.execute(
                "CREATE TRIGGER items_fts_delete AFTER DELETE ON items BEGIN"
                " DELETE FROM items_fts WHERE rowid = old.id; END"
            )
            con.execute("ALTER TABLE items DROP COLUMN pos")
        con.execute("DELETE FROM schema_migrations WHERE version > ?", (version,))
        con.commit()
    finally:
        con.close()


def old_match(path: Path, scope: str, word: str) -> list[int]:
    """Rowids a version 6 or 7 index finds for ``word`` in session ``scope``."""
    con = sqlite3.connect(path)
    try:
        query = f"scope : {scope} AND body : {word}"
        return [
            r[0]
            for r in con.execute("SELECT rowid FROM items_fts WHERE items_fts MATCH ?", (query,))
        ]
    finally:
        con.close()


@pytest.mark.parametrize("version", [6, 7])
async def test_a_version_6_or_7_database_migrates_to_the_same_index_the_writer_makes(
    tmp_path: Path, version: int
):
    """Migrations 7 and 8: the same rows, found and deleted as before, without a copy of the text."""
    path = tmp_path / "old.sqlite"
    store = SqliteStore(path)
    await store.open()
    other = SessionRef("tenant-b", ALICE.key)
    await store.record_exchange(ALICE, conversation(), None, req())
    await store.record_exchange(
        other, conversation(["Lyon? No: Paris.", "Noted"]), None, req("tenant-b")
    )
    await store.close()
    written = fts_rows(path)
    downgrade(path, version)
    assert old_match(path, "s1", "lyon") == [3]

    store = SqliteStore(path)
    await store.open()
    try:
        assert fts_rows(path) == written
        index = SqliteRecallIndex(store.fetch)
        assert [h.position for h in await index.search(ALICE, ["lyon"], limit=3)] == [2]
        assert [h.position for h in await index.search(other, ["lyon"], limit=3)] == [0]
        con = sqlite3.connect(path)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
        con.close()
        assert "items_fts_content" not in tables  # no second copy of every message's text
        await store.delete_session(ALICE)
        assert {rowid for rowid in fts_rows(path)} == {9, 10}  # the other tenant's two
        assert await SqliteRecallIndex(store.fetch).search(ALICE, ["lyon"], limit=3) == []
        await store.delete_session(other)
        assert fts_rows(path) == {}
    finally:
        await store.close()


async def test_every_word_is_in_its_sessions_namespace_whatever_the_text_spells(tmp_path: Path):
    # A text may spell another session's prefix: "_" is a separator, so it is not one.
    async with opened(tmp_path) as store:
        other = SessionRef("tenant-b", ALICE.key)
        await store.record_exchange(ALICE, conversation(["hello there"]), None, req())
        spelled = ["s1_lyon s1_ 'quoted' snake_case «Lyon»—Paris…", "ok"]
        await store.record_exchange(other, conversation(spelled), None, req("tenant-b"))
        rows = fts_rows(tmp_path / "s.sqlite")
        assert rows[2] == {"s2_", "s2_s1", "s2_lyon", "s2_quot", "s2_snake", "s2_case", "s2_pari"}
        index = SqliteRecallIndex(store.fetch)
        assert await index.search(ALICE, ["lyon"], limit=3) == []
        assert [h.position for h in await index.search(other, ["snake_case"], limit=3)] == [0]
        assert [h.position for h in await index.search(other, ["Paris"], limit=3)] == [0]


def test_a_query_term_is_looked_up_as_the_words_the_tokenizer_makes_of_it():
    assert words("snake_case") == ("snake", "case")
    assert words('lyon"') == ("lyon",)
    assert words("NEAR(") == ("near",)
    assert words("*") == ()
    assert words("Café") == ("cafe",)
    assert words("京都") == ("京都",)


async def test_a_recall_search_does_not_wait_behind_the_read_threads_queue(tmp_path: Path):
    # The index's statements are short: they run on the event loop's thread, so a
    # slow read queued on the store's read thread does not hold recall up; the hits
    # are those the read thread gives.
    async with opened(tmp_path) as store:
        await store.record_exchange(ALICE, conversation(), None, req())
        release = threading.Event()
        await store._conn.create_function("held", 0, lambda: release.wait(10) and 1)
        slow = asyncio.ensure_future(store.fetch("SELECT held()", ()))
        await asyncio.sleep(0.05)  # the read thread is now inside held()
        try:
            hits = await asyncio.wait_for(
                SqliteRecallIndex(store.fetch_short).search(ALICE, ["lyon"], limit=5), 2
            )
            assert not slow.done()
        finally:
            release.set()
            await slow
        assert hits and hits == await SqliteRecallIndex(store.fetch).search(
            ALICE, ["lyon"], limit=5
        )


class _Busy:
    """A connection whose every statement finds the database locked."""

    def execute(self, query: str, params: tuple[Any, ...]) -> Any:
        raise sqlite3.OperationalError("database is locked")

    def close(self) -> None:
        pass


async def test_a_short_read_that_finds_the_database_busy_goes_to_the_read_thread(tmp_path: Path):
    # The loop's reader never waits for a lock: busy, the read is the read thread's.
    async with opened(tmp_path) as store:
        await store.record_exchange(ALICE, conversation(), None, req())
        store._inline = _Busy()  # type: ignore[assignment]
        rows = await store.fetch_short("SELECT count(*) FROM sessions", ())
        assert [tuple(r) for r in rows] == [(1,)]
