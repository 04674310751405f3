"""The in-memory fake of the recall index: BM25 over a MemoryStore's items, in Python.

What :class:`~proxy.store.search.RecallIndex` promises, the simple way, with
the SQLite index's semantics: words are Porter-stemmed as SQLite's FTS5 and
the Redis index stem them (proxy/store/search_text.py), the terms worth
ranking by and the scores are the shared ones (proxy/store/bm25.py), over the
session's items that have words. Fine for tests; the SQLite index is the
production one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from proxy.store.base import SessionRef
from proxy.store.bm25 import average_length, informative, score, weight
from proxy.store.search import SearchHit
from proxy.store.search_text import search_text, words


class _Searchable(Protocol):
    """What the fake needs of the MemoryStore, without importing it."""

    async def searchable(
        self, session: SessionRef
    ) -> list[tuple[int, int, str, int | None, Any]]: ...


class MemoryRecallIndex:
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
        wanted = list(dict.fromkeys(w for t in terms for w in words(t)))
        if not wanted or limit <= 0:
            return []
        docs = [
            (item_id, pos, chash, tokens, Counter(words(search_text(m))))
            for item_id, pos, chash, tokens, m in await self._store.searchable(session)
        ]
        docs = [d for d in docs if d[4]]
        if not docs:
            return []
        average = average_length(sum(d[3] or 0 for d in docs), len(docs))
        holding = [sum(1 for d in docs if t in d[4]) for t in wanted]
        chosen = informative(wanted, holding, len(docs))
        weights = {t: weight(len(docs), n) for t, n in zip(wanted, holding, strict=True)}
        hits = []
        for item_id, pos, chash, tokens, said in docs:
            found = [(weights[t], said[t]) for t in chosen if t in said]
            if found and (before is None or pos < before):
                hits.append(SearchHit(item_id, pos, chash, score(found, tokens, average)))
        hits.sort(key=lambda h: (-h.score, -h.item_id))
        return hits[:limit]
