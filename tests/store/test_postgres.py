"""What the PostgreSQL store adds to the contract: several instances on one database, fencing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from proxy.store.postgres import PostgresStore
from proxy.store.postgres_jobs import FencedOut
from proxy.store.postgres_schema import MIGRATIONS
from tests.servers import require_postgres
from tests.stores import ALICE, ScratchPostgresStore, msg, req

SYSTEM, U1, A1 = msg("system", "be brief"), msg("user", "hi"), msg("assistant", "hello")


@pytest.fixture
async def two() -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two instances' stores on one schema (the second opens after the first made it)."""
    first = ScratchPostgresStore(require_postgres(), pool_size=4)
    second = PostgresStore(require_postgres(), pool_size=4, schema=first.schema)
    await asyncio.gather(first.open(), second.open())  # concurrent migrators: one migrates
    yield first, second
    await second.close()
    await first.close()


async def test_migrations_run_once_whoever_starts_first(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    first, _ = two
    versions = await first.pool.fetch("SELECT version FROM schema_migrations ORDER BY version")
    assert [r[0] for r in versions] == list(range(1, len(MIGRATIONS) + 1))


async def test_two_instances_writing_one_history_store_each_message_once(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    first, second = two
    prefix = [SYSTEM, U1, A1]
    results = await asyncio.gather(
        *(
            (first if i % 2 else second).record_exchange(
                ALICE, [*prefix, msg("user", f"q{i}")], msg("assistant", f"a{i}"), req()
            )
            for i in range(30)
        )
    )
    assert len({tuple(r.item_ids[:3]) for r in results if r is not None}) == 1
    info = await second.get_session(ALICE)
    assert info is not None and (info.item_count, info.request_count) == (3 + 60, 30)


async def test_each_write_bumps_the_session_version(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    first, second = two
    assert await first.session_version(ALICE) == 0
    await first.record_exchange(ALICE, [U1], A1, req())
    v1 = await second.session_version(ALICE)
    await second.record_exchange(ALICE, [U1, A1, msg("user", "more")], None, req())
    assert 0 < v1 < await first.session_version(ALICE)


async def test_a_write_with_an_older_fencing_token_is_refused_and_leaves_nothing(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    first, second = two
    await first.record_exchange(ALICE, [U1], A1, req(detail={"fence": 200}))
    before = await first.get_session(ALICE)
    stale = req(detail={"fence": 100})  # a holder whose lease ran out, writing late
    with pytest.raises(FencedOut):
        await second.record_exchange(ALICE, [U1, A1, msg("user", "late")], A1, stale)
    assert await first.get_session(ALICE) == before
    assert await first.request(stale.id) is None
    # The current holder (same or newer token) writes as usual.
    newer = await second.record_exchange(
        ALICE, [U1, A1, msg("user", "now")], None, req(detail={"fence": 300})
    )
    assert newer is not None and newer.new_messages == 1


async def test_an_unreachable_server_fails_open_with_the_servers_address() -> None:
    store = PostgresStore("postgresql://postgres@127.0.0.1:1/test", connect_timeout=2.0)
    with pytest.raises((OSError, asyncpg.PostgresError)):
        await store.open()
