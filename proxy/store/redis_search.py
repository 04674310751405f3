"""Recall on the Redis store: a per-session inverted index, kept in the same atomic writes.

Plain Redis has no full-text index, so the store keeps its own: for each
session a hash from each stemmed word to its postings (item id, term
frequency, item token count, position), appended by the very script that
stores the item (proxy/store/redis_scripts.py), so an item is searchable
exactly when it is stored, expires with its session and is deleted with it.
A search is one script that reads only the postings of the query's words
(work proportional to the matching items, never to the session) and scores
them as every backend does (proxy/store/bm25.py), handed its constants.

Words are what SQLite's ``porter unicode61`` tokenizer makes of the same
text (proxy/store/search_text.py): runs of letters and digits, lower-cased,
accents removed, Porter-stemmed (snowballstemmer's ``porter``), so a query
matches on Redis what it matches on SQLite. Postings written before the
length was the token count hold the item's words instead, until the session
expires: they rank a little differently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from proxy.store.base import SessionRef
from proxy.store.bm25 import SCRIPT_ARGS
from proxy.store.search import SearchHit
from proxy.store.search_text import search_text, stem, tokens, words


class _Searchable(Protocol):
    """What the index needs of the RedisStore (its SEARCH script), without importing it."""

    async def search(
        self,
        session: SessionRef,
        words: Sequence[str],
        *,
        limit: int,
        before: str,
        constants: Sequence[float],
    ) -> list[bytes]: ...


# Distinct words per item that are indexed: a bound on one write's work.
MAX_WORDS = 4096


def index_terms(message: Mapping[str, Any]) -> str:
    """An item's words for the store script: ``"word:tf word:tf ..."`` ('' for none)."""
    found = tokens(search_text(message))
    if not found:
        return ""
    counts: Counter[str] = Counter()
    for word, n in Counter(found).items():  # each distinct word stemmed once
        counts[stem(word)] += n
    return " ".join(f"{w}:{n}" for w, n in counts.most_common(MAX_WORDS))


class RedisRecallIndex:
    """The RecallIndex of a RedisStore (proxy/store/search.py has the contract)."""

    def __init__(self, store: _Searchable) -> None:
        self._store = store

    async def search(
        self,
        session: SessionRef,
        terms: Sequence[str],
        *,
        limit: int,
        before: int | None = None,
    ) -> list[SearchHit]:
        # In the query's order, as every backend sums the terms' scores.
        wanted = list(dict.fromkeys(w for term in terms for w in words(term)))
        if not wanted or limit <= 0:
            return []
        out = await self._store.search(
            session,
            wanted,
            limit=limit,
            before="" if before is None else str(before),
            constants=SCRIPT_ARGS,
        )
        return [
            SearchHit(int(out[i]), int(out[i + 1]), out[i + 3].decode(), float(out[i + 2]))
            for i in range(0, len(out), 4)
        ]
