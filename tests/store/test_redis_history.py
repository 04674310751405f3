"""The Redis store's history cache: served from memory, but only when Redis says it is current."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.store.redis import RedisStore
from tests.servers import require_redis
from tests.stores import ALICE, ScratchRedisStore, msg, req

SYSTEM, U1, A1 = msg("system", "be brief"), msg("user", "hi"), msg("assistant", "hello")
U2, A2 = msg("user", "weather?"), msg("assistant", "sunny")


@pytest.fixture
async def two() -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    """Two instances' stores on one Redis key prefix."""
    a = ScratchRedisStore(require_redis())
    b = RedisStore(require_redis(), prefix=a.prefix)
    await a.open()
    await b.open()
    yield a, b
    await b.close()
    await a.close()


def contents(items: list[Any]) -> list[Any]:
    return [i.message["content"] for i in items]


def items_read(store: RedisStore) -> list[int]:
    """How many items each history read brought over the wire."""
    counts: list[int] = []
    run = store._run

    async def counting(name: str, *args: Any) -> Any:
        out = await run(name, *args)
        if name == "HISTORY_SINCE":
            counts.append((len(out) - 3) // 2 if out else 0)
        return out

    store._run = counting  # type: ignore[method-assign]
    return counts


async def test_an_unchanged_session_is_served_from_the_cache(two):
    a, _ = two
    await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    first = await a.history(ALICE, shared=True)
    counts = items_read(a)

    again = await a.history(ALICE, shared=True)

    assert counts == [0]  # the session's id and head only
    assert [i is j for i, j in zip(first, again, strict=True)] == [True, True, True]
    own = await a.history(ALICE)  # not shared: copies a caller may change
    assert own == first and not any(i is j for i, j in zip(own, first, strict=True))


async def test_another_instances_write_is_seen_and_only_its_items_are_read(two):
    a, b = two
    await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    before = await a.history(ALICE, shared=True)
    await b.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A2, req())
    counts = items_read(a)

    got = await a.history(ALICE, shared=True)

    assert contents(got) == ["be brief", "hi", "hello", "weather?", "sunny"]
    assert counts == [2]  # the two new items, nothing before them
    assert got[:3] == before and got[3].parent_id == before[-1].id
    assert [(i.id, i.parent_id) for i in got] == [
        (i.id, i.parent_id) for i in await b.history(ALICE)
    ]


async def test_a_branch_written_elsewhere_replaces_the_cached_chain(two):
    a, b = two
    await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    await a.history(ALICE, shared=True)
    edited = msg("user", "hi, in French")
    await b.record_exchange(ALICE, [SYSTEM, edited], A2, req())

    assert contents(await a.history(ALICE, shared=True)) == ["be brief", "hi, in French", "sunny"]


async def test_a_session_deleted_and_made_again_elsewhere_is_read_afresh(two):
    a, b = two
    await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    await a.history(ALICE, shared=True)
    assert await b.delete_session(ALICE)
    assert await a.history(ALICE, shared=True) == []
    await b.record_exchange(ALICE, [U2], A2, req())

    got = await a.history(ALICE, shared=True)

    assert contents(got) == ["weather?", "sunny"]
    assert got[0].parent_id is None


async def test_a_session_made_again_unseen_is_not_taken_for_the_cached_one(two):
    """The cached head's id is never looked for in another session of the same name."""
    a, b = two
    await a.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    await a.history(ALICE, shared=True)
    assert await b.delete_session(ALICE)
    await b.record_exchange(ALICE, [SYSTEM, U2], A2, req())

    assert contents(await a.history(ALICE, shared=True)) == ["be brief", "weather?", "sunny"]
