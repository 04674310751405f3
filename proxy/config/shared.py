"""The ``store`` and ``coordination`` sections: which store, and how instances sharing it agree.

``store: {path: ...}`` is SQLite (the default); ``store: {url: ...}`` names a
shared store by its scheme (postgresql://, redis://). ``coordination:
{redis_url: ...}`` makes instances agree through Redis (proxy/coordination/).
A shared store without coordination is refused by ``proxy check`` and at
start-up unless ``coordination.single_instance: true`` says only one
instance uses it.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from proxy.config.model import CoordinationConfig, StoreConfig
from proxy.config.node import Node, duration
from proxy.errors import ConfigError

# URL schemes of the store backends (proxy/store/backends.py selects the class).
STORE_SCHEMES = ("postgresql", "postgres", "redis", "rediss", "unix")
REDIS_SCHEMES = ("redis", "rediss", "unix")
COORDINATION_KEYS = {"redis_url", "key_prefix", "lock_lease", "lock_wait", "single_instance"}

_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PREFIX = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def _url(node: Node, key: str, schemes: tuple[str, ...]) -> str | None:
    url = node.text(key, env=True)
    if url is None:
        return None
    scheme = urlsplit(url).scheme.lower()
    if scheme not in schemes:
        # The URL itself may hold a password: only its scheme is shown.
        raise ConfigError(
            node.at(key), f"scheme must be one of {', '.join(schemes)}, got {scheme or 'none'!r}"
        )
    return url


def store_config(node: Node) -> StoreConfig:
    d = StoreConfig()
    url = _url(node, "url", STORE_SCHEMES)
    if url is not None and node.has("path"):
        raise ConfigError(node.path, "give either path (SQLite) or url (a shared store), not both")
    schema = node.text("schema")
    if schema is not None and not _SCHEMA.fullmatch(schema):
        raise ConfigError(
            node.at("schema"),
            f"must be a lower-case SQL identifier ([a-z_][a-z0-9_]*), got {schema!r}",
        )
    if schema is not None and (
        url is None or urlsplit(url).scheme.lower() not in STORE_SCHEMES[:2]
    ):
        raise ConfigError(node.at("schema"), "applies to a postgresql:// store only")
    prefix = node.text("key_prefix")
    if prefix is not None and not _PREFIX.fullmatch(prefix):
        raise ConfigError(node.at("key_prefix"), f"must be 1-64 of [A-Za-z0-9_.:-], got {prefix!r}")
    if prefix is not None and (url is None or urlsplit(url).scheme.lower() not in REDIS_SCHEMES):
        raise ConfigError(node.at("key_prefix"), "applies to a redis:// store only")
    return StoreConfig(
        # Relative to the config file's folder, like every path in it.
        path=node.path_value("path", d.path) or d.path,
        url=url,
        pool_size=node.integer("pool_size", d.pool_size, minimum=1) or d.pool_size,
        schema=schema,
        key_prefix=prefix or d.key_prefix,
    )


def coordination_config(node: Node) -> CoordinationConfig:
    d = CoordinationConfig()
    prefix = node.text("key_prefix", d.key_prefix) or d.key_prefix
    if not _PREFIX.fullmatch(prefix):
        raise ConfigError(node.at("key_prefix"), f"must be 1-64 of [A-Za-z0-9_.:-], got {prefix!r}")
    single = node.raw("single_instance")
    if single is not None and not isinstance(single, bool):
        raise ConfigError(node.at("single_instance"), f"must be true or false, got {single!r}")
    url = _url(node, "redis_url", REDIS_SCHEMES)
    if url is not None and single:
        raise ConfigError(node.at("single_instance"), "cannot be true with a redis_url")
    lease = duration(node, "lock_lease") or d.lock_lease_s
    wait = duration(node, "lock_wait") or d.lock_wait_s
    if lease < 1:
        raise ConfigError(node.at("lock_lease"), f"must be at least 1s, got {lease:g}s")
    return CoordinationConfig(
        redis_url=url,
        key_prefix=prefix,
        lock_lease_s=lease,
        lock_wait_s=wait,
        single_instance=bool(single),
    )


def shared_store(store: StoreConfig) -> bool:
    """Whether several instances may use this store (a server, not a local file)."""
    return store.url is not None


def check_coordination(store: StoreConfig, coordination: CoordinationConfig) -> None:
    """Refuse a shared store without coordination, unless one instance is stated."""
    if shared_store(store) and coordination.redis_url is None and not coordination.single_instance:
        raise ConfigError(
            "coordination.redis_url",
            "is required with a shared store (store.url): without it, instances would race on "
            "history: server sessions and summaries. Set it, or set coordination.single_instance:"
            " true if exactly one instance uses this store",
        )
