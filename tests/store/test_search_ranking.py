"""Every recall index ranks alike: the same items, in the same order, with the same scores.

One BM25 (proxy/store/bm25.py) is computed four ways: in Python over the
candidates SQLite's FTS5 and PostgreSQL's ``tsvector`` find, in Python over
the in-memory fake's items, and in the Redis search script. Generated small
conversations and queries, the four stores side by side. The words are ones
that Porter (SQLite, Redis, the fake) and English snowball (PostgreSQL) stem
alike, plurals included, so that what matches is the same everywhere and only
the ranking is under test.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from hypothesis import event, given, settings
from hypothesis import strategies as st

from proxy.store.base import SessionRef, Store
from proxy.store.search import SearchHit
from proxy.store.search_backends import recall_index_for
from tests.store.test_search_contract import SEARCH_BACKENDS
from tests.stores import ALICE, make_store, msg, req

WORDS = [
    "refund",
    "refunds",
    "order",
    "orders",
    "parcel",
    "box",
    "bank",
    "card",
    "cards",
    "train",
    "lemon",
    "river",
    "ticket",
    "window",
]
# Scores are sums of the same floats in the same order; the tolerance is for
# PostgreSQL's and Redis's round trips of a double (%.17g) and nothing more.
TOLERANCE = 1e-9

_message = st.tuples(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=10),
    st.one_of(st.none(), st.integers(min_value=1, max_value=60)),
)
_sessions = itertools.count()


def tied(hits: list[SearchHit]) -> list[tuple[float, frozenset[int]]]:
    """The ranking as its runs of equal scores (ties may come in any order): (score, positions)."""
    runs: list[tuple[float, set[int]]] = []
    for h in hits:
        if runs and abs(runs[-1][0] - h.score) <= TOLERANCE:
            runs[-1][1].add(h.position)
        else:
            runs.append((h.score, {h.position}))
    return [(score, frozenset(positions)) for score, positions in runs]


def assert_alike(name: str, got: list[SearchHit], want: list[SearchHit]) -> None:
    mine, theirs = tied(got), tied(want)
    assert [p for _, p in mine] == [p for _, p in theirs], name
    for (a, _), (b, _) in zip(mine, theirs, strict=True):
        assert abs(a - b) <= TOLERANCE, (name, a, b)


def test_every_backend_ranks_any_small_conversation_alike(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    stores: dict[str, Store] = {b: make_store(b, tmp_path / b) for b in SEARCH_BACKENDS}
    for store in stores.values():
        loop.run_until_complete(store.open())

    async def rankings(
        texts: list[tuple[list[str], int | None]],
        query: list[str],
        before: int | None,
        limit: int,
    ) -> dict[str, tuple[list[SearchHit], list[SearchHit]]]:
        session = SessionRef("tenant-r", f"chat-{next(_sessions)}")
        chain = [
            msg("user" if i % 2 == 0 else "assistant", " ".join(words).capitalize() + ".", n)
            for i, (words, n) in enumerate(texts)
        ]
        out = {}
        for name, store in stores.items():
            await store.record_exchange(
                session, chain, None, req(session.tenant, session_key=session.key)
            )
            index = recall_index_for(store)
            assert index is not None
            # The limited search first: nothing read yet, it reads only what can rank.
            first = await index.search(session, query, limit=limit, before=before)
            out[name] = (await index.search(session, query, limit=100, before=before), first)
        return out

    @settings(max_examples=150, deadline=None)
    @given(texts=st.lists(_message, min_size=1, max_size=10), data=st.data())
    def check(texts: list[tuple[list[str], int | None]], data: st.DataObject) -> None:
        # Mostly words the conversation says (a query that finds nothing checks little).
        said = sorted({w for words, _ in texts for w in words})
        term = st.sampled_from(said) | st.sampled_from([*WORDS, "zyzzyva"])
        query = data.draw(st.lists(term, min_size=1, max_size=3), "query")
        before = data.draw(st.none() | st.integers(min_value=1, max_value=10), "before")
        limit = data.draw(st.integers(min_value=1, max_value=4), "limit")
        found = loop.run_until_complete(rankings(texts, query, before, limit))
        every, _ = found["sqlite"]
        event(f"hits: {min(len(every), 3)}+" if len(every) >= 3 else f"hits: {len(every)}")
        event("ties" if len(tied(every)) < len(every) else "no ties")
        for name, (theirs, their_first) in found.items():
            assert_alike(name, theirs, every)
            # The ``limit`` best are the best of the whole ranking (any of a tie at the cut).
            assert len(their_first) == min(limit, len(theirs)), name
            for got, want in zip(their_first, theirs, strict=False):
                assert abs(got.score - want.score) <= TOLERANCE, name

    try:
        check()
    finally:
        for store in stores.values():
            loop.run_until_complete(store.close())
        loop.close()


async def test_every_backend_leaves_out_the_same_common_words_of_a_long_session(
    tmp_path: Path,
) -> None:
    # "order" is in every one of 121 items (more than bm25.COMMON_MIN): with "lost"
    # there, "lost" alone ranks; with nothing rarer, the two rarest still do.
    texts = [f"the order {i} is shipped" for i in range(120)] + ["the order is lost"]
    chain = [msg("user" if i % 2 == 0 else "assistant", t, 5) for i, t in enumerate(texts)]
    found: dict[str, tuple[list[SearchHit], list[SearchHit]]] = {}
    for name in SEARCH_BACKENDS:
        store = make_store(name, tmp_path / name)
        await store.open()
        try:
            await store.record_exchange(ALICE, chain, None, req())
            index = recall_index_for(store)
            assert index is not None
            found[name] = (
                await index.search(ALICE, ["order", "lost"], limit=3),
                await index.search(ALICE, ["order", "shipped", "the"], limit=200),
            )
        finally:
            await store.close()
    rare, common = found["sqlite"]
    assert [h.position for h in rare] == [120]
    assert len(common) == 121
    for name, (their_rare, their_common) in found.items():
        assert_alike(name, their_rare, rare)
        assert_alike(name, their_common, common)
