"""The recall index seam: search a session's stored items by the words of a message.

A small protocol with one implementation per store backend: SQLite FTS5
(proxy/store/sqlite_search.py), PostgreSQL with a ``tsvector`` column and an idf-weighted
``ts_rank`` (proxy/store/postgres_search.py), Redis with its own inverted index
(proxy/store/redis_search.py), the in-memory fake (proxy/store/memory_search.py).
One contract test runs against every implementation (tests/store/test_search_contract.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.store.base import SessionRef


@dataclass(frozen=True)
class SearchHit:
    """One stored item that matched."""

    item_id: int
    # The item's position in its chain: its depth from the root (the root is 0),
    # which is its index in any conversation that resends that chain.
    position: int
    # So the caller can check that the message at ``position`` of its own list is this one.
    content_hash: str
    # Higher is better; comparable only within one result.
    score: float


class RecallIndex(Protocol):
    """What the recall step needs from storage. The contract every backend keeps:

    - **Scope.** ``search`` sees only the items of ``session`` (tenant and
      key): never another session's, never another tenant's with the same key.
      An unknown session gives ``[]``. A deleted session's items are gone from
      the index with it (and expiry's too).
    - **Consistency.** An item is searchable once the exchange that stored it
      is committed, as soon as the item itself (the index is written in the
      same transaction); items of every branch of the session are found.
    - **Matching.** ``terms`` are lower-case words, already without
      stopwords; an item matches if it contains any of them (OR), compared
      after the backend's stemming (SQLite: porter; PostgreSQL: the
      ``english`` configuration). The searchable text is
      :func:`proxy.store.search_text.search_text` of the stored message.
    - **Ranking.** Best first by Okapi BM25 as :func:`proxy.store.bm25.score`
      computes it (rarer terms and more occurrences score higher, items of
      more stored tokens lower), the same scores on every backend
      (tests/store/test_search_ranking.py); the newest of equals first. At
      most ``limit`` hits, the ``limit`` best of the whole ranking; only items
      whose ``position`` is below ``before`` when it is given.
    - **Cost.** One indexed query; no work proportional to the session's
      length beyond the matching items. Errors raise (the caller serves the
      request without recall).
    """

    async def search(
        self,
        session: SessionRef,
        terms: Sequence[str],
        *,
        limit: int,
        before: int | None = None,
    ) -> list[SearchHit]: ...
