"""A session's vectors in memory (proxy/context/semantic.py): loaded by cursor, bounded, searched."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from proxy.context.embedder import to_bytes
from proxy.context.semantic import VectorCache
from proxy.store.base import SessionRef
from proxy.store.memory import MemoryStore
from proxy.store.sqlite import SqliteStore
from proxy.store.sqlite_vectors import SqliteVectorIndex
from proxy.store.vectors import ItemVector, StoredVectors
from tests.stores import ALICE, msg, req

DIM = 4


def unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


class CountingIndex:
    """A MemoryStore's vector index that records what each read returned."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.reads: list[tuple[int, int]] = []  # (after, rows returned)

    async def put_vectors(self, session: SessionRef, vectors: list[ItemVector]) -> None:
        await self.store.put_vectors(session, vectors)

    async def vectors(self, session: SessionRef, *, after: int = 0) -> StoredVectors:
        got = await self.store.vectors(session, after=after)
        self.reads.append((after, len(got.rows)))
        return got


async def session_with(store: MemoryStore, ref: SessionRef, vectors: list[np.ndarray]) -> list[int]:
    conversation = [msg("user", f"m{i} {ref.key}") for i in range(len(vectors))]
    result = await store.record_exchange(ref, conversation, None, req(ref.tenant))
    assert result is not None
    await store.put_vectors(
        ref,
        [
            ItemVector(result.item_ids[i], i, conversation[i].content_hash, to_bytes(v))
            for i, v in enumerate(vectors)
        ],
    )
    return result.item_ids


async def test_nearest_ranks_by_cosine_and_skips_positions_from_before_on():
    store = MemoryStore()
    ids = await session_with(store, ALICE, [unit(1, 0, 0, 0), unit(1, 1, 0, 0), unit(0, 0, 1, 0)])
    entry = await VectorCache(CountingIndex(store), DIM).get(ALICE)
    assert entry is not None
    near = entry.nearest(unit(1, 0.2, 0, 0), 3)
    assert [n.item_id for n in near] == [ids[0], ids[1], ids[2]]
    assert near[0].score > near[1].score > near[2].score
    assert [n.position for n in entry.nearest(unit(1, 0.2, 0, 0), 3, before=1)] == [0]


async def test_a_session_is_loaded_once_then_only_what_is_new():
    store = MemoryStore()
    index = CountingIndex(store)
    cache = VectorCache(index, DIM)
    await session_with(store, ALICE, [unit(1, 0, 0, 0)] * 50)
    await cache.get(ALICE)
    await cache.get(ALICE)
    assert index.reads == [(0, 50), (50, 0)]
    conversation = [msg("user", f"m{i} {ALICE.key}") for i in range(50)] + [msg("user", "new")]
    result = await store.record_exchange(ALICE, conversation, None, req())
    assert result is not None
    vector = ItemVector(
        result.item_ids[50], 50, conversation[50].content_hash, to_bytes(unit(0, 1, 0, 0))
    )
    await store.put_vectors(ALICE, [vector])
    entry = await cache.get(ALICE)
    assert index.reads[-1] == (50, 1)
    assert entry is not None and entry.count == 51
    assert entry.nearest(unit(0, 1, 0, 0), 1)[0].position == 50


async def test_a_deleted_or_remade_session_starts_over():
    store = MemoryStore()
    cache = VectorCache(CountingIndex(store), DIM)
    await session_with(store, ALICE, [unit(1, 0, 0, 0)] * 3)
    assert (entry := await cache.get(ALICE)) is not None and entry.count == 3
    await store.delete_session(ALICE)
    assert await cache.get(ALICE) is None and cache.rows == 0
    await session_with(store, ALICE, [unit(0, 1, 0, 0)])
    entry = await cache.get(ALICE)
    assert entry is not None and entry.count == 1
    assert entry.nearest(unit(0, 1, 0, 0), 5)[0].score > 0.99


async def test_the_cache_is_bounded_by_rows_least_recently_searched_first():
    store = MemoryStore()
    cache = VectorCache(CountingIndex(store), DIM, max_rows=10)
    refs = [SessionRef("t", f"s{i}") for i in range(3)]
    for ref in refs:
        await session_with(store, ref, [unit(1, 0, 0, 0)] * 4)
    for ref in refs:
        await cache.get(ref)
    assert cache.rows <= 10
    assert cache.peek(refs[0]) is None and cache.peek(refs[2]) is not None


async def test_a_vector_of_another_dimension_is_skipped(tmp_path: Path):
    store = SqliteStore(tmp_path / "s.db")
    await store.open()
    try:
        conversation = [msg("user", "a"), msg("assistant", "b")]
        result = await store.record_exchange(ALICE, conversation, None, req())
        assert result is not None
        index = SqliteVectorIndex(store.fetch, store.write)
        await index.put_vectors(
            ALICE,
            [
                ItemVector(result.item_ids[0], 0, conversation[0].content_hash, b"\x00" * 3),
                ItemVector(
                    result.item_ids[1], 1, conversation[1].content_hash, to_bytes(unit(1, 0, 0, 0))
                ),
            ],
        )
        entry = await VectorCache(index, DIM).get(ALICE)
        assert entry is not None and entry.count == 1 and entry.positions[0] == 1
    finally:
        await store.close()
