"""The registry of store backends (proxy/store/registry.py): a name per backend, found from a
store or a URL, each building its store and that store's indexes; modules loaded when used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.store.backends import SCHEMES, StoreSpec, build_store
from proxy.store.base import Store
from proxy.store.memory_search import MemoryRecallIndex
from proxy.store.postgres_search import PostgresRecallIndex
from proxy.store.postgres_vectors import PostgresVectorIndex
from proxy.store.redis_search import RedisRecallIndex
from proxy.store.redis_vectors import RedisVectorIndex
from proxy.store.registry import BACKENDS, backend, backend_of
from proxy.store.search_backends import items_versions_for, recall_index_for, vector_index_for
from proxy.store.sqlite_search import SqliteRecallIndex
from proxy.store.sqlite_vectors import SqliteVectorIndex
from tests.stores import ALICE, msg, req

REPO = Path(__file__).resolve().parents[2]

# The fixture's backend -> the registry's name, and the indexes its store gets (None:
# the store itself, as the in-memory fake keeps its vectors).
INDEXES: dict[str, tuple[str, type, type | None]] = {
    "sqlite": ("sqlite", SqliteRecallIndex, SqliteVectorIndex),
    "memory": ("memory", MemoryRecallIndex, None),
    "redis": ("redis", RedisRecallIndex, RedisVectorIndex),
    "postgres": ("postgresql", PostgresRecallIndex, PostgresVectorIndex),
}


async def test_a_store_finds_its_backend_and_gets_working_indexes(
    store: Store, request: pytest.FixtureRequest
) -> None:
    name, recall_type, vector_type = INDEXES[request.node.callspec.params["store"]]
    assert backend_of(store) is backend(name)
    recall = recall_index_for(store)
    assert isinstance(recall, recall_type)
    vectors = vector_index_for(store)
    assert vectors is store if vector_type is None else isinstance(vectors, vector_type)
    await store.record_exchange(ALICE, [msg("user", "where is parcel 88412")], None, req())
    assert [h.position for h in await recall.search(ALICE, ["parcel"], limit=3)] == [0]


async def test_only_sqlite_knows_every_write_of_its_items(store: Store) -> None:
    versions = items_versions_for(store)
    assert (versions is not None) == (backend_of(store).name == "sqlite")


def test_every_url_scheme_names_a_registered_backend_and_builds_its_store() -> None:
    assert set(SCHEMES.values()) <= set(BACKENDS)
    for scheme, name in SCHEMES.items():
        url = f"{scheme}://127.0.0.1/x" if scheme != "unix" else "unix:///tmp/redis.sock"
        assert backend_of(build_store(StoreSpec(path="unused", url=url))).name == name


def test_no_url_builds_sqlite_at_the_path(tmp_path: Path) -> None:
    store = build_store(StoreSpec(path=str(tmp_path / "s.db")))
    assert backend_of(store).name == "sqlite"


def test_a_sqlite_proxy_never_loads_the_postgresql_or_redis_drivers(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from proxy.store.backends import StoreSpec, build_store\n"
        "from proxy.store.search_backends import recall_index_for, vector_index_for\n"
        f"store = build_store(StoreSpec(path={str(tmp_path / 's.db')!r}))\n"
        "recall_index_for(store), vector_index_for(store)\n"
        "print(sorted(m for m in ('asyncpg', 'redis') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
