"""Which recall index (and vector index) serves a store: one per backend.

A new backend adds its case here. The PostgreSQL and Redis modules are imported
only when such a store is in use: asyncpg and redis-py are ~10 MB of RSS that a
SQLite proxy never needs (``build_store`` imports them lazily too).
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.store.base import SessionRef, Store
from proxy.store.memory import MemoryStore
from proxy.store.memory_search import MemoryRecallIndex
from proxy.store.search import RecallIndex
from proxy.store.sqlite import SqliteStore
from proxy.store.sqlite_search import SqliteRecallIndex
from proxy.store.sqlite_vectors import SqliteVectorIndex
from proxy.store.vectors import VectorIndex


def recall_index_for(store: Store) -> RecallIndex | None:
    """The store's recall index; None for a backend without one (recall is then off)."""
    if isinstance(store, SqliteStore):
        return SqliteRecallIndex(store.fetch_short)
    if isinstance(store, MemoryStore):
        return MemoryRecallIndex(store)
    from proxy.store.postgres import PostgresStore
    from proxy.store.postgres_search import PostgresRecallIndex
    from proxy.store.redis import RedisStore
    from proxy.store.redis_search import RedisRecallIndex

    if isinstance(store, PostgresStore):
        return PostgresRecallIndex(store._fetch)
    if isinstance(store, RedisStore):
        return RedisRecallIndex(store)
    return None


def items_versions_for(store: Store) -> Callable[[SessionRef], int | None] | None:
    """The version of a session's stored items, where the store knows every write of them
    (SQLite: one process serves it); None elsewhere (the recall memo is then off)."""
    if isinstance(store, SqliteStore):
        return store.items_version
    return None


def vector_index_for(store: Store) -> VectorIndex | None:
    """The store's vector index (semantic recall); None for a backend without one."""
    if isinstance(store, SqliteStore):
        return SqliteVectorIndex(store.fetch, store.write)
    if isinstance(store, MemoryStore):
        return store
    from proxy.store.postgres import PostgresStore
    from proxy.store.postgres_vectors import PostgresVectorIndex
    from proxy.store.redis import RedisStore
    from proxy.store.redis_vectors import RedisVectorIndex

    if isinstance(store, PostgresStore):
        return PostgresVectorIndex(store._fetch, store._transaction)
    if isinstance(store, RedisStore):
        return RedisVectorIndex(store)
    return None
