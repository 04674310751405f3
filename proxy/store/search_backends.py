"""Which recall index serves a store: one per backend (a new backend adds its case here)."""

from __future__ import annotations

from proxy.store.base import Store
from proxy.store.memory import MemoryStore
from proxy.store.memory_search import MemoryRecallIndex
from proxy.store.postgres import PostgresStore
from proxy.store.postgres_search import PostgresRecallIndex
from proxy.store.redis import RedisStore
from proxy.store.redis_search import RedisRecallIndex
from proxy.store.search import RecallIndex
from proxy.store.sqlite import SqliteStore
from proxy.store.sqlite_search import SqliteRecallIndex


def recall_index_for(store: Store) -> RecallIndex | None:
    """The store's recall index; None for a backend without one (recall is then off)."""
    if isinstance(store, SqliteStore):
        return SqliteRecallIndex(store.fetch)
    if isinstance(store, MemoryStore):
        return MemoryRecallIndex(store)
    if isinstance(store, PostgresStore):
        return PostgresRecallIndex(store._fetch)
    if isinstance(store, RedisStore):
        return RedisRecallIndex(store)
    return None
