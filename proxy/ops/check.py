"""What ``python -m proxy check`` says about a config's store and coordination.

The config loader already refuses a shared store without coordination
(proxy/config/shared.py); this tells an operator which backend and which
coordination a valid config uses, and which features a backend lacks.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from proxy.config.model import Config
from proxy.store.backends import SHARED, backend_name

# Features a backend does not have, and what the proxy does instead.
LIMITS: dict[str, tuple[str, ...]] = {
    "sqlite": (),
    "postgresql": (),
    "redis": (
        "standalone Redis 7.0+ (or with replicas / Sentinel), not Redis Cluster;"
        " set maxmemory-policy noeviction and appendonly yes (it is the only copy)",
        "native expiry uses the session.ttl the proxy started with (a reload changes the"
        " sweep at once, the keys' expiry at the next restart)",
        "recall: no full-text engine in Redis; the store keeps its own per-session inverted"
        " index (Porter stems, BM25 in a script: proxy/store/redis_search.py), the same"
        " matches as SQLite's FTS5, the order may differ slightly",
    ),
}


def redact(url: str) -> str:
    """The URL without its password (a check's output lands in CI logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


def describe(config: Config) -> list[str]:
    store, coordination = config.store, config.coordination
    backend = backend_name(store.url)
    lines: list[str] = []
    if store.url is None:
        lines.append(f"store: sqlite at {store.path} (one instance per file)")
    else:
        extra = f", pool {store.pool_size}" if backend == "postgresql" else ""
        schema = f", schema {store.schema}" if store.schema else ""
        lines.append(f"store: {backend} at {redact(store.url)}{extra}{schema} (shared)")
    if coordination.redis_url is not None:
        lines.append(
            f"coordination: redis at {redact(coordination.redis_url)}, key prefix "
            f"{coordination.key_prefix!r}, session lock lease {coordination.lock_lease_s:g}s, "
            f"wait {coordination.lock_wait_s:g}s"
        )
    elif backend in SHARED:
        lines.append("coordination: in-process (single_instance: true; never run two instances)")
    else:
        lines.append("coordination: in-process (one instance)")
    for limit in LIMITS.get(backend, ()):
        lines.append(f"limit ({backend}): {limit}")
    return lines
