"""The PostgreSQL recall index: migration 3 indexes existing databases as the writer does."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import orjson

from proxy.store.base import MessageIn, SessionRef
from proxy.store.postgres import PostgresStore
from proxy.store.search_backends import recall_index_for
from tests.servers import require_postgres
from tests.store.test_search_contract import conversation
from tests.store.test_search_sqlite import SHAPES
from tests.stores import ALICE, RUN, req

# What a database from before migration 3 lacks.
FORGET = """
    DROP INDEX items_search;
    ALTER TABLE items DROP COLUMN search, DROP COLUMN position;
    DROP TEXT SEARCH CONFIGURATION ctx_english;
    DROP TEXT SEARCH DICTIONARY ctx_english_stem;
    DELETE FROM schema_migrations WHERE version = 3;
"""


async def indexed(store: PostgresStore) -> dict[int, tuple[Any, str]]:
    rows = await store.pool.fetch("SELECT id, position, search::text AS search FROM items")
    return {r["id"]: (r["position"], r["search"]) for r in rows}


async def test_migration_3_indexes_an_existing_database_like_the_writer_does() -> None:
    url, schema = require_postgres(), f"ctxtest_{RUN}_{uuid.uuid4().hex[:8]}"
    store = PostgresStore(url, pool_size=2, schema=schema)
    await store.open()
    shapes = [MessageIn(m, hashlib.sha256(orjson.dumps(m)).hexdigest(), "user", 1) for m in SHAPES]
    try:
        await store.record_exchange(ALICE, conversation(), None, req())
        await store.record_exchange(SessionRef("t2", "k"), shapes, None, req("t2"))
        written = await indexed(store)
        await store.pool.execute(FORGET)
    finally:
        await store.close()
    store = PostgresStore(url, pool_size=2, schema=schema)
    await store.open()
    try:
        backfilled = await indexed(store)
        assert backfilled == written
        assert len(written) == len(conversation()) + len(SHAPES)
        assert any(search for _, search in written.values())  # not all empty
        index = recall_index_for(store)
        assert index is not None
        hits = await index.search(ALICE, ["lyon"], limit=3)
        assert [h.position for h in hits] == [2]
    finally:
        await store.pool.execute(f"DROP SCHEMA {schema} CASCADE")
        await store.close()


async def test_migration_5_gives_a_version_4_database_the_indexes_recall_reads() -> None:
    url, schema = require_postgres(), f"ctxtest_{RUN}_{uuid.uuid4().hex[:8]}"
    store = PostgresStore(url, pool_size=2, schema=schema)
    await store.open()
    try:
        await store.record_exchange(ALICE, conversation(), None, req())
        await store.pool.execute(
            "DROP INDEX items_session_id; ALTER INDEX items_search SET (fastupdate = on);"
            " DELETE FROM schema_migrations WHERE version = 5"
        )
    finally:
        await store.close()
    store = PostgresStore(url, pool_size=2, schema=schema)
    await store.open()
    try:
        options = await store.pool.fetchval(
            "SELECT reloptions FROM pg_class WHERE oid = 'items_search'::regclass"
        )
        assert options == ["fastupdate=off"]
        assert await store.pool.fetchval("SELECT 'items_session_id'::regclass::text")
        index = recall_index_for(store)
        assert index is not None
        hits = await index.search(ALICE, ["lyon"], limit=3)
        assert [h.position for h in hits] == [2]
    finally:
        await store.pool.execute(f"DROP SCHEMA {schema} CASCADE")
        await store.close()
