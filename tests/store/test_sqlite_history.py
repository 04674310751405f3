"""The SQLite store's history cache: its bounds and its reads (the behaviours every store's
cache shares: test_history_caches.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.store.base import SessionRef
from proxy.store.sqlite import SqliteStore
from tests.stores import ALICE, msg, req

SYSTEM, U1, A1 = msg("system", "be brief"), msg("user", "hi"), msg("assistant", "hello")
U2, A2 = msg("user", "weather?"), msg("assistant", "sunny")


def contents(items: list[Any]) -> list[Any]:
    return [i.message["content"] for i in items]


def rows_read(store: SqliteStore) -> list[int]:
    """How many rows each history read fetched (the session's and its new items)."""
    counts: list[int] = []
    fetch = store._fetch

    async def counting(query: str, params: tuple[Any, ...]) -> Any:
        rows = await fetch(query, params)
        counts.append(len(rows))
        return rows

    store._fetch = counting  # type: ignore[method-assign]
    return counts


async def test_the_cache_is_bounded_by_its_bytes(tmp_path: Path):
    store = SqliteStore(tmp_path / "small.db")
    store._histories.max_bytes = 3_000  # about two sessions of three short items
    await store.open()
    try:
        for n in range(6):
            ref = SessionRef("t", f"s{n}")
            await store.record_exchange(ref, [msg("user", f"q{n}")], msg("assistant", "a"), req())
            await store.history(ref, shared=True)
            assert store._histories.size <= 3_000
        assert 1 <= len(store._histories) < 6
        # Evicted or not, every read is right.
        for n in range(6):
            got = await store.history(SessionRef("t", f"s{n}"))
            assert contents(got) == [f"q{n}", "a"]
    finally:
        await store.close()


async def test_a_loop_over_more_sessions_than_fit_still_serves_some_from_memory(tmp_path: Path):
    """Agents in turn over a cache that holds a share of them: those are served from
    memory (one row read), the rest read afresh, and every read is right."""
    store = SqliteStore(tmp_path / "loop.db")
    store._histories.max_bytes = 200_000  # ~10 sessions of 20 items of ~700 bytes
    await store.open()
    try:
        refs = [SessionRef("t", f"agent-{n}") for n in range(24)]
        for ref in refs:
            turns = [msg("user", f"{ref.key} {i} " + "x" * 100) for i in range(19)]
            await store.record_exchange(ref, turns, msg("assistant", "a"), req())
        for _ in range(3):
            for ref in refs:
                await store.history(ref, shared=True)
        held = len(store._histories)
        assert 5 <= held < len(refs)
        counts = rows_read(store)
        for ref in refs:
            got = await store.history(ref, shared=True)
            assert contents(got)[-2:] == [f"{ref.key} 18 " + "x" * 100, "a"] and len(got) == 20
        # The sessions held answered with the session's row alone; a plain LRU
        # would have evicted each just before its next read (every read whole).
        assert counts.count(1) == held
        assert store._histories.size <= 200_000
    finally:
        await store.close()


async def test_a_chain_read_afresh_is_root_first_with_its_hashes_and_statuses(tmp_path: Path):
    """Rows come head first, hashes as stored (16 bytes, or text): the items are as written."""
    from proxy.store.base import path_hash
    from proxy.store.sqlite_history import _oldest_first

    cut = msg("assistant", "the answ", status="incomplete")
    store = SqliteStore(tmp_path / "p.db")
    await store.open()
    try:
        await store.record_exchange(ALICE, [SYSTEM, U1], cut, req())
        await store.record_exchange(ALICE, [SYSTEM, U1, cut, U2], A2, req())
        store._histories.forget(ALICE)  # read afresh: every row of the chain
        items = await store.history(ALICE)
    finally:
        await store.close()
    sent = [SYSTEM, U1, cut, U2, A2]
    assert [i.message for i in items] == [m.message for m in sent]
    # sha256 content hashes (64 digits) stay text; blake2b path hashes (32) come from bytes.
    assert [i.content_hash for i in items] == [m.content_hash for m in sent]
    parents: list[str | None] = [None, *(i.path_hash for i in items[:-1])]
    assert [i.path_hash for i in items] == [
        path_hash(parent, m.content_hash) for parent, m in zip(parents, sent, strict=True)
    ]
    assert [i.status for i in items] == [
        "complete",
        "complete",
        "incomplete",
        "complete",
        "complete",
    ]
    assert [i.parent_id for i in items[1:]] == [i.id for i in items[:-1]]
    # Rows out of depth order (never seen from SQLite) are still put root first.
    shuffled = [(1, 5, i, *([None] * 9), depth) for i, depth in ((7, 1), (9, 0), (3, 2))]
    assert [row[2] for row in _oldest_first(shuffled)] == [3, 7, 9]
