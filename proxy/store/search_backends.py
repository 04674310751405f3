"""Which recall index (and vector index) serves a store: the one its backend builds
(proxy/store/registry.py)."""

from __future__ import annotations

from proxy.store.base import Store
from proxy.store.registry import Versions, backend_of
from proxy.store.search import RecallIndex
from proxy.store.vectors import VectorIndex


def recall_index_for(store: Store) -> RecallIndex | None:
    """The store's recall index; None for a backend without one (recall is then off)."""
    return backend_of(store).recall(store)


def items_versions_for(store: Store) -> Versions | None:
    """The version of a session's stored items, where the store knows every write of them
    (SQLite: one process serves it); None elsewhere (the recall memo is then off)."""
    return backend_of(store).versions(store)


def vector_index_for(store: Store) -> VectorIndex | None:
    """The store's vector index (semantic recall); None for a backend without one."""
    return backend_of(store).vectors(store)
