"""Recall on the Redis store beyond the shared recall contract: the index is written once per item.

Instances that have not cached a session's chain send a long history without
its words; the script names the new items and only those are stemmed and
indexed (proxy/store/redis_codec.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.store.bm25 import average_length, score, weight
from proxy.store.redis import RedisStore
from proxy.store.redis_search import RedisRecallIndex, index_terms, words
from tests.stores import ALICE, ScratchRedisStore, msg, req, require_redis

HISTORY = [
    msg("user" if i % 2 == 0 else "assistant", f"turn {i} about topic{i}") for i in range(10)
]


@pytest.fixture
async def pair() -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    a = ScratchRedisStore(require_redis())
    await a.open()
    b = RedisStore(require_redis(), prefix=a.prefix)  # a second instance, cache empty
    await b.open()
    yield a, b
    await b.close()
    await a.close()


async def test_a_cold_instance_indexes_only_the_new_items_of_a_resent_history(
    pair: tuple[RedisStore, RedisStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    await a.record_exchange(ALICE, HISTORY, None, req())
    stemmed: list[str] = []

    def counted(message: dict[str, Any]) -> str:
        stemmed.append(message["content"])
        return index_terms(message)

    monkeypatch.setattr(b, "_index", counted)
    new = [msg("user", "what about zebras"), msg("assistant", "zebras are striped")]
    result = await b.record_exchange(ALICE, [*HISTORY, new[0]], new[1], req())
    assert result is not None and result.new_messages == 1
    assert stemmed == ["what about zebras", "zebras are striped"]

    index = RedisRecallIndex(b)
    assert sorted(h.position for h in await index.search(ALICE, ["zebra"], limit=5)) == [10, 11]
    # The resent items were not indexed again: one hit each, not two.
    for position in range(10):
        hits = await index.search(ALICE, [f"topic{position}"], limit=5)
        assert [h.position for h in hits] == [position]


async def test_a_long_new_history_is_indexed_whole(pair: tuple[RedisStore, RedisStore]) -> None:
    _, b = pair
    await b.record_exchange(ALICE, HISTORY, None, req())
    hits = await RedisRecallIndex(b).search(ALICE, ["topic0", "topic9"], limit=5)
    assert sorted(h.position for h in hits) == [0, 9]


def test_words_are_porter_stems_of_letter_and_digit_runs_without_accents() -> None:
    assert words("Paintings, LANDSCAPES; the café_order #88412") == [
        "paint",
        "landscap",
        "the",
        "cafe",
        "order",
        "88412",
    ]
    assert index_terms({"role": "user", "content": "order order 12"}) == "order:2 12:1"
    assert index_terms({"role": "user", "content": "  "}) == ""


async def test_words_in_most_of_a_long_session_are_left_out_when_rarer_ones_are_there(
    pair: tuple[RedisStore, RedisStore],
) -> None:
    # As the SQLite index does: "order" is in every item, so a query with "lost"
    # ranks by "lost" alone; with nothing rarer, the rarest words still rank.
    a, _ = pair
    texts = [f"the order {i} is shipped" for i in range(120)] + ["the order is lost"]
    history = [msg("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]
    await a.record_exchange(ALICE, history, None, req())
    index = RedisRecallIndex(a)
    assert [h.position for h in await index.search(ALICE, ["order", "lost"], limit=3)] == [120]
    assert len(await index.search(ALICE, ["order", "shipped"], limit=3)) == 3


async def test_a_word_said_in_hundreds_of_items_is_indexed_in_chunks_all_of_them_read(
    pair: tuple[RedisStore, RedisStore],
) -> None:
    # An append copies only the word's last chunk of postings; a search reads them all.
    a, _ = pair
    texts = [f"the order {i} is shipped" for i in range(400)]
    history = [msg("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]
    for end in range(100, 401, 100):  # as a conversation grows, and at once
        await a.record_exchange(ALICE, history[:end], None, req())
    info = await a.get_session(ALICE)
    assert info is not None
    client = a._client
    assert client is not None
    chunks = await client.hget(f"{a.prefix}x:{info.id}", "order#n")
    assert chunks is not None and int(chunks) >= 1
    hits = await RedisRecallIndex(a).search(ALICE, ["order", "shipped"], limit=500)
    assert sorted(h.position for h in hits) == list(range(400))


async def test_the_search_script_scores_with_the_constants_it_is_handed(
    pair: tuple[RedisStore, RedisStore],
) -> None:
    # k1 2, b .5 instead of bm25.py's: the script has no BM25 literal of its own.
    a, _ = pair
    texts = [("refund refund refund late", 10), ("a refund", 4), ("the parcel", None)]
    chain = [msg("user" if i % 2 == 0 else "assistant", t, n) for i, (t, n) in enumerate(texts)]
    await a.record_exchange(ALICE, chain, None, req())
    out = await a.search(ALICE, ["refund"], limit=5, before="", constants=(2.0, 0.5, 0.05, 50))
    got = [(int(out[i + 1]), float(out[i + 2])) for i in range(0, len(out), 4)]
    w, average = weight(3, 2), average_length(14, 3)
    assert got == [
        (0, score([(w, 3)], 10, average, k1=2.0, b=0.5)),
        (1, score([(w, 1)], 4, average, k1=2.0, b=0.5)),
    ]
