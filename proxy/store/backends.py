"""Which Store a config names: the one place a store URL's scheme picks a backend.

``store.path`` (no ``url``): SQLite, the default. ``store.url``:
``postgresql://`` (or ``postgres://``) for PostgreSQL, ``redis://``
(``rediss://``, ``unix://``) for Redis; a further backend adds its schemes to
``SCHEMES`` and itself to the registry (proxy/store/registry.py), which
builds the store (its module imported only then: a proxy on SQLite never
loads asyncpg or redis).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from proxy.store.base import Store
from proxy.store.registry import StoreSpec, backend

__all__ = ["SCHEMES", "SHARED", "StoreSpec", "backend_name", "build_store"]

# URL scheme -> backend name.
SCHEMES: dict[str, str] = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
}

# Backends that several instances can share: they need coordination (proxy check).
SHARED = frozenset({"postgresql", "redis"})


def backend_name(url: str | None) -> str:
    """``sqlite`` without a URL; else the backend its scheme names (ValueError if none)."""
    if url is None:
        return "sqlite"
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        known = ", ".join(sorted(SCHEMES))
        raise ValueError(f"unknown store URL scheme {scheme!r} (known: {known})")
    return SCHEMES[scheme]


def build_store(spec: StoreSpec) -> Store:
    store: Store = backend(backend_name(spec.url)).store(spec)
    return store
