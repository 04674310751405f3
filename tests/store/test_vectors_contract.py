"""The vector index contract (proxy/store/vectors.py), run against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.store.base import ExchangeResult, SessionRef, Store
from proxy.store.search_backends import vector_index_for
from proxy.store.vectors import ItemVector, VectorIndex
from tests.stores import ALICE, make_store, msg, req

# Every backend keeps vectors (proxy/store/search_backends.py).
VECTOR_BACKENDS = ["sqlite", "memory", "redis", "postgres"]
BOB = SessionRef("tenant-b", ALICE.key)


@pytest.fixture(params=VECTOR_BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = make_store(request.param, tmp_path)
    await s.open()
    yield s
    await s.close()


def index(store: Store) -> VectorIndex:
    found = vector_index_for(store)
    assert found is not None
    return found


async def stored(store: Store, session: SessionRef, texts: list[str]) -> ExchangeResult:
    conversation = [msg("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]
    result = await store.record_exchange(session, conversation, None, req(session.tenant))
    assert result is not None
    return result


def vectors(result: ExchangeResult, texts: list[str], start: int = 0) -> list[ItemVector]:
    out = []
    for i in range(start, len(texts)):
        message = msg("user" if i % 2 == 0 else "assistant", texts[i])
        out.append(ItemVector(result.item_ids[i], i, message.content_hash, bytes([i]) * 8))
    return out


TEXTS = ["one", "two", "three", "four"]


async def test_vectors_come_back_with_their_items_positions_and_hashes_in_order(store: Store):
    result = await stored(store, ALICE, TEXTS)
    await index(store).put_vectors(ALICE, vectors(result, TEXTS)[:2])
    got = await index(store).vectors(ALICE)
    assert got.session_id == result.session_id
    assert got.rows == vectors(result, TEXTS)[:2]


async def test_a_cursor_returns_only_what_was_stored_after_it_and_nothing_twice(store: Store):
    result = await stored(store, ALICE, TEXTS)
    idx = index(store)
    rows = vectors(result, TEXTS)
    await idx.put_vectors(ALICE, rows[:2])
    first = await idx.vectors(ALICE)
    assert (await idx.vectors(ALICE, after=first.cursor)).rows == []
    # Out of position order, and one again: stored order, once.
    await idx.put_vectors(ALICE, [rows[3], rows[0], rows[2]])
    second = await idx.vectors(ALICE, after=first.cursor)
    assert second.rows == [rows[3], rows[2]]
    assert (await idx.vectors(ALICE, after=second.cursor)).rows == []
    assert [r.item_id for r in (await idx.vectors(ALICE)).rows] == [
        rows[i].item_id for i in (0, 1, 3, 2)
    ]


async def test_an_item_keeps_its_first_vector(store: Store):
    result = await stored(store, ALICE, TEXTS)
    idx = index(store)
    row = vectors(result, TEXTS)[0]
    await idx.put_vectors(ALICE, [row])
    await idx.put_vectors(ALICE, [ItemVector(row.item_id, 0, row.content_hash, b"\x00" * 8)])
    assert (await idx.vectors(ALICE)).rows == [row]


async def test_unknown_sessions_and_other_sessions_items_are_ignored(store: Store):
    idx = index(store)
    nobody = SessionRef("tenant-a", "nobody")
    await idx.put_vectors(nobody, [ItemVector(1, 0, "h", b"\x01" * 8)])
    got = await idx.vectors(nobody)
    assert got.session_id is None and got.rows == []
    mine = await stored(store, ALICE, TEXTS)
    theirs = await stored(store, BOB, ["cats", "dogs"])
    # Bob's item ids offered under Alice's session: not hers, ignored.
    await idx.put_vectors(ALICE, vectors(theirs, ["cats", "dogs"]))
    assert (await idx.vectors(ALICE)).rows == []
    await idx.put_vectors(BOB, vectors(theirs, ["cats", "dogs"]))
    await idx.put_vectors(ALICE, vectors(mine, TEXTS)[:1])
    # Same key, another tenant: each sees only its own.
    assert [r.position for r in (await idx.vectors(BOB)).rows] == [0, 1]
    assert [r.item_id for r in (await idx.vectors(ALICE)).rows] == [mine.item_ids[0]]


async def test_a_deleted_session_takes_its_vectors_and_a_new_one_has_a_new_id(store: Store):
    result = await stored(store, ALICE, TEXTS)
    idx = index(store)
    await idx.put_vectors(ALICE, vectors(result, TEXTS))
    await store.delete_session(ALICE)
    gone = await idx.vectors(ALICE)
    assert gone.session_id is None and gone.rows == []
    again = await stored(store, ALICE, ["five"])
    fresh = await idx.vectors(ALICE)
    assert fresh.rows == [] and fresh.session_id == again.session_id != result.session_id


async def test_vectors_of_a_later_exchange_follow_the_cursor(store: Store):
    texts = TEXTS[:2]
    first = await stored(store, ALICE, texts)
    idx = index(store)
    await idx.put_vectors(ALICE, vectors(first, texts))
    seen = await idx.vectors(ALICE)
    longer = [*TEXTS]
    second = await stored(store, ALICE, longer)
    await idx.put_vectors(ALICE, vectors(second, longer, start=2))
    later = await idx.vectors(ALICE, after=seen.cursor)
    assert [r.position for r in later.rows] == [2, 3]


async def test_items_pruned_with_a_deleted_response_take_their_vectors(store: Store):
    from tests.store.test_responses import chained

    await chained(store)
    items = await store.history(ALICE)
    idx = index(store)
    await idx.put_vectors(
        ALICE, [ItemVector(it.id, i, it.content_hash, b"\x00\x3c") for i, it in enumerate(items)]
    )
    assert await store.delete_response(ALICE.tenant, "resp_2")
    kept = [it.id for it in await store.history(ALICE)]
    assert 0 < len(kept) < len(items)
    assert [r.item_id for r in (await idx.vectors(ALICE)).rows] == kept
