"""The SQLite store's chain cache: a resent history is not looked up again, and nothing changes."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.store import sqlite_jobs
from proxy.store.base import MessageIn, SessionRef, chain_path_hashes
from proxy.store.chains import ITEM_BYTES, ChainCache
from proxy.store.sqlite import SqliteStore
from tests.stores import ALICE, msg, req

SYSTEM = msg("system", "be brief")
U1, A1, U2, A2, U3 = (
    msg("user", "hi"),
    msg("assistant", "hello"),
    msg("user", "weather?"),
    msg("assistant", "sunny"),
    msg("user", "thanks"),
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "store.sqlite")
    await s.open()
    yield s
    await s.close()


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The path hashes each job looked up in SQLite."""
    seen: list[list[str]] = []
    real = sqlite_jobs.select_ids

    def spy(conn: sqlite3.Connection, session_id: int, hashes: Sequence[str]) -> dict[str, int]:
        seen.append(list(hashes))
        return real(conn, session_id, hashes)

    monkeypatch.setattr(sqlite_jobs, "select_ids", spy)
    return seen


def paths(*messages: MessageIn) -> list[str]:
    return chain_path_hashes([m.content_hash for m in messages])


def dump(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Everything stored that does not depend on the clock or on request ids."""
    with sqlite3.connect(db) as conn:
        return {
            "sessions": conn.execute(
                "SELECT id, tenant, key, head_item_id FROM sessions ORDER BY id"
            ).fetchall(),
            "items": conn.execute(
                "SELECT id, session_id, parent_id, path_hash, content_hash, role, token_count,"
                " status, message_json FROM items ORDER BY id"
            ).fetchall(),
            "requests": conn.execute(
                "SELECT session_id, session_key, status, dropped_item_ids, first_item_id,"
                " last_item_id, reply_item_id FROM requests ORDER BY rowid"
            ).fetchall(),
        }


async def test_a_resent_history_is_looked_up_only_for_its_new_items(store, lookups):
    first = await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    assert lookups[0] == paths(SYSTEM, U1, A1)  # then the ids of what it inserted
    lookups.clear()

    second = await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A2, req())

    assert lookups[0] == paths(SYSTEM, U1, A1, U2, A2)[3:]
    assert first is not None and second is not None
    assert second.item_ids[:3] == [*first.item_ids, first.reply_id]
    assert second.new_messages == 1
    assert [h.id for h in await store.history(ALICE)] == [*second.item_ids, second.reply_id]


async def test_a_forked_history_reuses_only_the_shared_prefix(store, lookups):
    await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A2, req())
    lookups.clear()
    edited = msg("user", "weather in Paris?")

    result = await store.record_exchange(ALICE, [SYSTEM, U1, A1, edited], A2, req())

    assert lookups[0] == paths(SYSTEM, U1, A1, edited, A2)[3:]
    assert result is not None and result.new_messages == 1
    assert [h.message for h in await store.history(ALICE)] == [
        m.message for m in (SYSTEM, U1, A1, edited, A2)
    ]


async def test_a_failed_commit_is_not_remembered(store, monkeypatch):
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    before = store._chains.get(ALICE)
    writer = store._writer
    assert writer is not None and before is not None
    real = writer._conn

    class FailingCommit:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error")
            return real.execute(sql, *args)

    monkeypatch.setattr(writer, "_conn", FailingCommit())
    with pytest.raises(sqlite3.OperationalError):
        await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A2, req())
    monkeypatch.undo()
    assert store._chains.get(ALICE) == before

    retry = await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A2, req())
    assert retry is not None and retry.new_messages == 1
    assert [h.message for h in await store.history(ALICE)] == [
        m.message for m in (SYSTEM, U1, A1, U2, A2)
    ]


async def test_a_failed_exchange_is_not_remembered(store):
    duplicate = req()
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, duplicate)
    before = store._chains.get(ALICE)
    # The job inserts U2 and A2, then fails on the request id: all of it rolls back.
    with pytest.raises(ValueError, match="already stored"):
        await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A2, duplicate)
    assert store._chains.get(ALICE) == before

    result = await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A2, req())
    assert result is not None and result.new_messages == 1
    assert len(await store.history(ALICE)) == 5


async def test_a_session_expired_and_made_again_gets_new_items(store, tmp_path):
    first = await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    assert await store.delete_idle_sessions(older_than=float("inf")) == 1
    assert store._chains.get(ALICE) is not None  # stale, and never trusted

    again = await store.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A2, req())

    assert first is not None and again is not None
    assert again.new_messages == 4
    assert set(again.item_ids).isdisjoint([*first.item_ids, first.reply_id])
    assert [h.id for h in await store.history(ALICE)] == [*again.item_ids, again.reply_id]


async def test_a_session_deleted_through_the_store_is_forgotten(store):
    await store.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    assert await store.delete_session(ALICE)
    assert store._chains.get(ALICE) is None


def test_the_cache_is_bounded_by_sessions_and_by_items():
    cache = ChainCache(max_sessions=2, max_bytes=5 * ITEM_BYTES)
    refs = [SessionRef("t", k) for k in "abc"]
    for i, ref in enumerate(refs):
        cache.committed(ref, i, ["h"], ["p"], [i])
    assert len(cache) == 2 and cache.get(refs[0]) is None
    cache.committed(refs[2], 9, list("abcde"), list("abcde"), [1, 2, 3, 4, 5])
    assert len(cache) == 1 and cache.get(refs[2]) is not None
    cache.committed(refs[1], 9, list("abcdef"), list("abcdef"), [1, 2, 3, 4, 5, 6])
    assert cache.get(refs[1]) is None  # longer than the whole budget


# Scripted conversations: each exchange resends a prefix of what the session
# sent so far (or forks it), sometimes from another tenant, sometimes after
# the session was deleted.
_step = st.tuples(
    st.sampled_from(["append", "resend", "fork", "delete", "expire", "fail"]),
    st.integers(0, 6),
    st.sampled_from([ALICE, SessionRef("tenant-b", "chat-1")]),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_step, min_size=1, max_size=12))
async def test_stored_rows_are_the_same_with_or_without_the_cache(tmp_path_factory, steps):
    directory = tmp_path_factory.mktemp("chains")
    cached, uncached = SqliteStore(directory / "a.sqlite"), SqliteStore(directory / "b.sqlite")
    uncached._chains = ChainCache(max_sessions=0)  # never remembers anything
    stores = (cached, uncached)
    for s in stores:
        await s.open()
    try:
        histories: dict[SessionRef, list[MessageIn]] = {}
        for n, (action, cut, ref) in enumerate(steps):
            history = histories.get(ref, [SYSTEM])
            if action == "delete":
                for s in stores:
                    await s.delete_session(ref)
                histories.pop(ref, None)
                continue
            if action == "expire":  # every session, behind the cache's back
                for s in stores:
                    await s.delete_idle_sessions(older_than=float("inf"))
                histories.clear()
                continue
            if action == "fork":
                history = history[: 1 + cut % len(history)]
            conversation = [*history, msg("user", f"q{n}")]
            reply = msg("assistant", f"a{n}") if action != "resend" else None
            outcomes = []
            for s in stores:
                record = req(id=f"dup-{ref.tenant}") if action == "fail" else req()
                try:
                    outcomes.append(await s.record_exchange(ref, conversation, reply, record))
                except ValueError:
                    outcomes.append("failed")
            assert outcomes[0] == outcomes[1]
            if outcomes[0] != "failed":
                histories[ref] = [*conversation, *([reply] if reply else [])]
        assert dump(cached.path) == dump(uncached.path)
    finally:
        for s in stores:
            await s.close()
