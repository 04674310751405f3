"""The in-memory fake of the recall index: BM25 over a MemoryStore's items, in Python.

What :class:`~proxy.store.search.RecallIndex` promises, the simple way: words
are Porter-stemmed as SQLite's FTS5 and the Redis index stem them
(proxy/store/search_text.py), scores are Okapi BM25 (k1 1.2, b 0.75) over the
session's items. Fine for tests; the SQLite index is the production one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from proxy.store.base import SessionRef
from proxy.store.search import SearchHit
from proxy.store.search_text import search_text, stem, words

if TYPE_CHECKING:
    from proxy.store.memory import MemoryStore


class MemoryRecallIndex:
    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def search(
        self,
        session: SessionRef,
        terms: Sequence[str],
        *,
        limit: int,
        before: int | None = None,
    ) -> list[SearchHit]:
        if not terms or limit <= 0:
            return []
        items = await self._store.searchable(session)
        wanted = {stem(t.lower()) for t in terms}
        docs = [(i, pos, chash, Counter(words(search_text(m)))) for i, pos, chash, m in items]
        docs = [d for d in docs if sum(d[3].values())]
        if not docs:
            return []
        average = sum(sum(d[3].values()) for d in docs) / len(docs)
        frequency = {t: sum(1 for d in docs if t in d[3]) for t in wanted}
        hits = []
        for item_id, pos, chash, tf in docs:
            if before is not None and pos >= before:
                continue
            length = sum(tf.values())
            score = 0.0
            for t in wanted:
                if t in tf:
                    n = frequency[t]
                    idf = math.log(1 + (len(docs) - n + 0.5) / (n + 0.5))
                    f = tf[t]
                    score += idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * length / average))
            if score > 0:
                hits.append(SearchHit(item_id, pos, chash, score))
        hits.sort(key=lambda h: -h.score)
        return hits[:limit]
