"""Which Store a config names: the one place a store URL's scheme picks a backend.

``store.path`` (no ``url``): SQLite, the default. ``store.url``:
``postgresql://`` (or ``postgres://``) for PostgreSQL, ``redis://``
(``rediss://``, ``unix://``) for Redis; each further backend adds its scheme
to ``SCHEMES`` and a branch to ``build_store``. Imports are
lazy so a proxy on SQLite never loads asyncpg or redis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from proxy.store.base import CacheBudget, Store

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
    backend = backend_name(spec.url)
    if backend == "postgresql":
        from proxy.store.postgres import PostgresStore

        assert spec.url is not None
        return PostgresStore(
            spec.url, pool_size=spec.pool_size, schema=spec.schema, caches=spec.caches
        )
    if backend == "redis":
        from proxy.store.redis import RedisStore

        assert spec.url is not None
        return RedisStore(
            spec.url, prefix=f"{spec.key_prefix}:", ttl_s=spec.ttl_s, caches=spec.caches
        )
    from proxy.store.sqlite import SqliteStore

    return SqliteStore(spec.path, caches=spec.caches)
