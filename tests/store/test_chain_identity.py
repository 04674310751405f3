"""A replayed chain's stored items give their own path hashes and ids; the rest are hashed."""

from __future__ import annotations

from proxy.store.base import MessageIn, StoredItem, chain_identity, chain_path_hashes


def stored(content: list[str], session_id: int = 7) -> list[StoredItem]:
    paths = chain_path_hashes(content)
    return [
        StoredItem(
            100 + i, session_id, 100 + i - 1 if i else None, paths[i], h, "user", 1,
            {"role": "user", "content": h}, "complete", 0.0,
        )
        for i, h in enumerate(content)
    ]  # fmt: skip


def new(h: str) -> MessageIn:
    return MessageIn({"role": "user", "content": h}, h, "user", 1)


def test_stored_items_then_new_ones_hash_as_the_whole_chain_would():
    chain = [*stored(["a", "b", "c"]), new("d"), new("e")]
    paths, ids = chain_identity(chain, 7)
    assert paths == chain_path_hashes(["a", "b", "c", "d", "e"])
    assert ids == [100, 101, 102]


def test_another_sessions_items_or_a_broken_link_are_not_taken_as_stored():
    assert chain_identity(stored(["a", "b"], session_id=8), 7)[1] == []
    a, _, c = stored(["a", "b", "c"])
    # b missing: c is not b's parent's child, so only a is known.
    paths, ids = chain_identity([a, c, new("d")], 7)
    assert ids == [100]
    assert paths == chain_path_hashes(["a", "c", "d"])
    assert chain_identity([], 7) == ([], [])
