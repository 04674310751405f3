"""The recall index contract (proxy/store/search.py), run against every backend."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.store.base import MessageIn, SessionRef, Store
from proxy.store.search import RecallIndex
from proxy.store.search_backends import recall_index_for
from tests.stores import ALICE, make_store, msg, req

# The backends with a recall index (proxy/store/search_backends.py); a backend
# that gains one adds itself here. The others serve recall requests without
# recall (X-Context-Recall: unsupported).
SEARCH_BACKENDS = ["sqlite", "memory", "redis", "postgres"]


@pytest.fixture(params=SEARCH_BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = make_store(request.param, tmp_path)
    await s.open()
    yield s
    await s.close()


TEXTS = [
    "Good morning, I would like to ask about my order.",
    "Sure, which order is it?",
    "Order 88412: the delivery address is 17 Quai des Celestins in Lyon.",
    "Thanks, noted the address.",
    "I also love painting landscapes on weekends.",
    "Painting is a wonderful hobby; landscapes especially.",
    "What's the weather like?",
    "Sunny and warm.",
]


def conversation(texts: list[str] = TEXTS) -> list[MessageIn]:
    return [msg("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]


def index(store: Store) -> RecallIndex:
    found = recall_index_for(store)
    assert found is not None
    return found


async def stored(store: Store, session: SessionRef = ALICE, texts: list[str] = TEXTS) -> None:
    await store.record_exchange(session, conversation(texts), None, req(session.tenant))


async def test_finds_the_item_that_holds_the_words_with_its_position_and_hash(store: Store):
    await stored(store)
    hits = await index(store).search(ALICE, ["delivery", "address"], limit=5)
    assert hits and hits[0].position == 2
    assert hits[0].content_hash == conversation()[2].content_hash
    assert hits[0].score > 0
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


async def test_words_match_after_stemming(store: Store):
    await stored(store)
    hits = await index(store).search(ALICE, ["paintings", "landscape"], limit=5)
    assert {h.position for h in hits} == {4, 5}


async def test_an_item_with_more_of_the_words_ranks_first(store: Store):
    await stored(store)
    hits = await index(store).search(ALICE, ["order", "delivery", "lyon"], limit=5)
    assert hits[0].position == 2
    assert {h.position for h in hits} >= {0, 1, 2}


async def test_another_tenant_with_the_same_session_key_sees_nothing_of_it(store: Store):
    other = SessionRef("tenant-b", ALICE.key)
    await stored(store)
    await stored(store, other, ["Unrelated chat about cats.", "Cats are great."])
    assert await index(store).search(other, ["address", "lyon"], limit=10) == []
    mine = await index(store).search(ALICE, ["cats"], limit=10)
    assert mine == []
    theirs = await index(store).search(other, ["cats"], limit=10)
    assert {h.position for h in theirs} == {0, 1}


async def test_another_session_of_the_same_tenant_sees_nothing_of_it(store: Store):
    await stored(store)
    assert await index(store).search(SessionRef(ALICE.tenant, "chat-2"), ["lyon"], limit=5) == []


async def test_before_limits_positions_and_limit_caps_the_hits(store: Store):
    await stored(store)
    hits = await index(store).search(ALICE, ["order", "painting"], limit=10, before=3)
    assert {h.position for h in hits} == {0, 1, 2}
    assert len(await index(store).search(ALICE, ["order", "painting"], limit=2)) == 2


async def test_no_terms_or_unknown_words_find_nothing(store: Store):
    await stored(store)
    assert await index(store).search(ALICE, [], limit=5) == []
    assert await index(store).search(ALICE, ["zyzzyva"], limit=5) == []


async def test_terms_with_quotes_and_fts_syntax_are_plain_words(store: Store):
    await stored(store)
    hits = await index(store).search(ALICE, ['lyon"', "AND", "NEAR(", "*"], limit=5)
    assert all(isinstance(h.position, int) for h in hits)


async def test_a_deleted_session_leaves_nothing_searchable(store: Store):
    await stored(store)
    await store.delete_session(ALICE)
    assert await index(store).search(ALICE, ["lyon"], limit=5) == []
    await stored(store, ALICE, ["A new chat about Lyon."])
    hits = await index(store).search(ALICE, ["lyon"], limit=5)
    assert [h.position for h in hits] == [0]


async def test_every_branch_is_searchable_at_its_own_positions(store: Store):
    await stored(store)
    edited = [*TEXTS[:2], "Actually the order goes to Marseille.", "Noted."]
    await stored(store, ALICE, edited)
    hits = await index(store).search(ALICE, ["marseille"], limit=5)
    assert [h.position for h in hits] == [2]


async def test_tool_calls_and_responses_items_are_searchable(store: Store):
    call: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "track_parcel", "arguments": '{"carrier": "colissimo"}'},
            }
        ],
    }
    item = {"type": "function_call_output", "call_id": "c1", "output": "parcel in Villeurbanne"}
    parts = {"role": "user", "content": [{"type": "input_text", "text": "where is it"}]}
    messages = [parts, call, item]
    chain = [
        MessageIn(m, hashlib.sha256(orjson.dumps(m)).hexdigest(), str(m.get("role", "tool")), 3)
        for m in messages
    ]
    await store.record_exchange(ALICE, chain, None, req())
    idx = index(store)
    assert [h.position for h in await idx.search(ALICE, ["colissimo"], limit=5)] == [1]
    assert [h.position for h in await idx.search(ALICE, ["villeurbanne"], limit=5)] == [2]
    assert [h.position for h in await idx.search(ALICE, ["where"], limit=5)] == [0]


async def ranked(store: Store, texts: list[tuple[str, int | None]], terms: list[str]) -> list[Any]:
    """Positions and scores (rounded) of ``terms`` over a conversation of (text, token count)."""
    chain = [msg("user" if i % 2 == 0 else "assistant", t, n) for i, (t, n) in enumerate(texts)]
    await store.record_exchange(ALICE, chain, None, req())
    return [
        (h.position, round(h.score, 4)) for h in await index(store).search(ALICE, terms, limit=5)
    ]


async def test_an_item_saying_a_word_more_often_ranks_above_a_shorter_one_saying_it_once(
    store: Store,
):
    # Okapi BM25 (proxy/store/bm25.py): idf ln(1 + (3 - 2 + .5) / (2 + .5)) = .4700,
    # average length 14 tokens; three "refund"s in 18 tokens: .4700 * 3 * 2.2 /
    # (3 + 1.2 * (.25 + .75 * 18 / 14)) = .6960; one in 12: .4700 * 2.2 / (1 + 1.2 *
    # (.25 + .75 * 12 / 14)) = .4992. Counted once per item, the first would be .4208.
    texts = [
        ("Refund, refund, refund: the charge is wrong, I want my money back.", 18),
        ("I can look into a refund for you today.", 12),
        ("The parcel arrived late and the box was damaged.", 12),
    ]
    assert await ranked(store, texts, ["refund"]) == [(0, 0.696), (1, 0.4992)]


async def test_an_items_length_is_its_stored_token_count(store: Store):
    # Both say "refund" once; the first is 2 words but 30 tokens (a hash), the
    # second 9 words in 10 tokens: the second is the shorter item. The third's count
    # is unknown: it adds nothing to the total and counts as the average, 40 / 3.
    texts = [
        ("Refund 4f9a1c7e2b3d5e6f7a8b9c0d1e2f3a4b", 30),
        ("Please could you send the refund to my card", 10),
        ("The parcel arrived late.", None),
    ]
    assert await ranked(store, texts, ["refund"]) == [(1, 0.5235), (0, 0.311)]


async def test_an_item_without_searchable_text_weighs_nothing(store: Store):
    # N is 2, not 3, and the average 5 tokens, not 20: ln(1 + 1.5 / 1.5) * 2.2 /
    # (1 + 1.2 * (.25 + .75 * 4 / 5)) = .7549.
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Refund please"},
        {"type": "reasoning", "summary": []},
        {"role": "assistant", "content": "The parcel arrived"},
    ]
    chain = [
        MessageIn(m, hashlib.sha256(orjson.dumps(m)).hexdigest(), str(m.get("role", "tool")), n)
        for m, n in zip(messages, [4, 50, 6], strict=True)
    ]
    await store.record_exchange(ALICE, chain, None, req())
    hits = await index(store).search(ALICE, ["refund"], limit=5)
    assert [(h.position, round(h.score, 4)) for h in hits] == [(0, 0.7549)]
