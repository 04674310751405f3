"""The store backends by name: each backend's module has a ``BACKEND`` that builds its store and
that store's recall and vector indexes.

As encode/databases keys its backends by URL scheme (``"postgresql":
"databases.backends.postgres:PostgresBackend"``), a name here is a
``module:attribute`` string, imported the first time it is asked for: a proxy
on SQLite never loads asyncpg or redis-py (~10 MB of RSS). A URL's scheme
picks the name (proxy/store/backends.py); a store says its own (its class's
``backend``), so its indexes are found with no ``isinstance`` and built by
its own module, the only code that knows its internals.

A fifth backend: a module with a store class naming ``backend`` and a
``BACKEND``, its line in ``BACKENDS``, and its URL schemes in
``backends.SCHEMES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from proxy.store.base import CacheBudget, SessionRef, Store
from proxy.store.search import RecallIndex
from proxy.store.vectors import VectorIndex

# Backend name -> "module:attribute" of its Backend.
BACKENDS: dict[str, str] = {
    "sqlite": "proxy.store.sqlite:BACKEND",
    "postgresql": "proxy.store.postgres:BACKEND",
    "redis": "proxy.store.redis:BACKEND",
    "memory": "proxy.store.memory:BACKEND",
}


@dataclass(frozen=True)
class StoreSpec:
    """What the store section says, as plain values (the store package never imports config)."""

    path: str
    url: str | None = None
    pool_size: int = 10
    schema: str | None = None
    # session.ttl: the Redis store gives every session's keys a native expiry.
    ttl_s: float | None = None
    # The Redis store's keys are "<key_prefix>:...".
    key_prefix: str = "ctxproxy:store"
    # cache.max_bytes: the stores' chain and history caches take their shares of it.
    caches: CacheBudget = field(default_factory=CacheBudget)


S = TypeVar("S")
Versions = Callable[[SessionRef], int | None]


def _unversioned(store: object) -> Versions | None:
    return None


@dataclass(frozen=True)
class Backend(Generic[S]):
    """One backend: how its store is built from the config, and its indexes from its store."""

    name: str
    store: Callable[[StoreSpec], S]
    # None: a backend without that index (recall, or semantic recall, is then off).
    recall: Callable[[S], RecallIndex | None]
    vectors: Callable[[S], VectorIndex | None]
    # The version of a session's stored items, where the store knows every write of
    # them (one process serves it: the recall memo is then on); None elsewhere.
    versions: Callable[[S], Versions | None] = _unversioned


def backend(name: str) -> Backend[Any]:
    """The backend of that name (KeyError if none), its module imported now."""
    module, _, attribute = BACKENDS[name].partition(":")
    found: Backend[Any] = getattr(importlib.import_module(module), attribute)
    return found


def backend_of(store: Store) -> Backend[Any]:
    """The backend a store belongs to (the one its class names)."""
    return backend(store.backend)
