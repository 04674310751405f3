"""The stores' history caches (SQLite, Redis; PostgreSQL's in test_postgres.py): a chain
served from memory only when the store says it is current, whichever instance wrote."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.store.redis import RedisStore
from proxy.store.sqlite import SqliteStore
from tests.servers import require_redis
from tests.stores import ALICE, ScratchRedisStore, msg, req

SYSTEM, U1, A1 = msg("system", "be brief"), msg("user", "hi"), msg("assistant", "hello")
U2, A2 = msg("user", "weather?"), msg("assistant", "sunny")


def sqlite_reads(store: Any) -> list[int]:
    """Items each history read fetched (SQLite: its rows with an item)."""
    counts: list[int] = []
    fetch = store._fetch

    async def counting(query: str, params: tuple[Any, ...]) -> Any:
        rows = await fetch(query, params)
        counts.append(sum(1 for row in rows if row[2] is not None))
        return rows

    store._fetch = counting
    return counts


def redis_reads(store: Any) -> list[int]:
    """Items each history read brought over the wire (Redis: HISTORY_SINCE's)."""
    counts: list[int] = []
    run = store._run

    async def counting(name: str, *args: Any) -> Any:
        out = await run(name, *args)
        if name == "HISTORY_SINCE":
            counts.append((len(out) - 3) // 2 if out else 0)
        return out

    store._run = counting
    return counts


Two = tuple[Any, Any, Callable[[Any], list[int]]]


@pytest.fixture(params=["sqlite", "redis"])
async def two(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Two]:
    """Two instances' stores on one database, and how to count what a read fetches."""
    a: Any
    b: Any
    if request.param == "sqlite":
        a, b = SqliteStore(tmp_path / "shared.db"), SqliteStore(tmp_path / "shared.db")
        reads = sqlite_reads
    else:
        a = ScratchRedisStore(require_redis())
        b = RedisStore(require_redis(), prefix=a.prefix)
        reads = redis_reads
    await a.open()
    await b.open()
    yield a, b, reads
    await b.close()
    await a.close()


def contents(items: list[Any]) -> list[Any]:
    return [i.message["content"] for i in items]


async def test_an_unchanged_session_is_served_from_the_cache(two: Two) -> None:
    a, _, reads = two
    await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    first = await a.history(ALICE, shared=True)
    counts = reads(a)

    again = await a.history(ALICE, shared=True)

    assert counts == [0]  # the session's id and head only: no item read again
    assert [i is j for i, j in zip(first, again, strict=True)] == [True, True, True]
    own = await a.history(ALICE)  # not shared: copies a caller may change
    assert own == first and not any(i is j for i, j in zip(own, first, strict=True))


async def test_another_instances_write_is_seen_and_only_its_items_are_read(two: Two) -> None:
    a, b, reads = two
    await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    before = await a.history(ALICE, shared=True)
    # The other process appends a turn: the first one's cache cannot know.
    await b.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A2, req())
    counts = reads(a)

    got = await a.history(ALICE, shared=True)

    assert contents(got) == ["be brief", "hi", "hello", "weather?", "sunny"]
    assert counts == [2]  # the two new items, nothing before them
    assert got[:3] == before and got[3].parent_id == before[-1].id
    theirs = await b.history(ALICE)
    assert [(i.id, i.parent_id) for i in got] == [(i.id, i.parent_id) for i in theirs]


async def test_a_branch_written_elsewhere_replaces_the_cached_chain(two: Two) -> None:
    a, b, _ = two
    await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    await a.history(ALICE, shared=True)
    edited = msg("user", "hi, in French")
    await b.record_exchange(ALICE, [SYSTEM, edited], A2, req())

    assert contents(await a.history(ALICE, shared=True)) == ["be brief", "hi, in French", "sunny"]


async def test_a_session_deleted_and_made_again_elsewhere_is_read_afresh(two: Two) -> None:
    a, b, _ = two
    await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    await a.history(ALICE, shared=True)
    assert await b.delete_session(ALICE)
    assert await a.history(ALICE, shared=True) == []
    await b.record_exchange(ALICE, [U2], A2, req())

    got = await a.history(ALICE, shared=True)

    assert contents(got) == ["weather?", "sunny"]
    assert got[0].parent_id is None


async def test_a_session_made_again_unseen_is_not_taken_for_the_cached_one(two: Two) -> None:
    """The cached head's id is never looked for in another session of the same name."""
    a, b, _ = two
    await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    await a.history(ALICE, shared=True)
    assert await b.delete_session(ALICE)
    await b.record_exchange(ALICE, [SYSTEM, U2], A2, req())

    assert contents(await a.history(ALICE, shared=True)) == ["be brief", "weather?", "sunny"]
