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


async def test_a_cached_history_never_serves_another_instances_stale_view(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    first, second = two
    await first.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    assert [h.message for h in await first.history(ALICE)] == [
        SYSTEM.message,
        U1.message,
        A1.message,
    ]
    # Another instance appends a turn: the first instance's next read sees it.
    U2, A2 = msg("user", "more"), msg("assistant", "sure")
    await second.record_exchange(ALICE, [SYSTEM, U1, A1, U2], A2, req())
    history = await first.history(ALICE)
    assert [h.message["content"] for h in history] == ["be brief", "hi", "hello", "more", "sure"]
    # ... an edit that branches off: the whole new chain, not the cached one extended.
    edited = msg("user", "hi there")
    await second.record_exchange(ALICE, [SYSTEM, edited], A1, req())
    assert [h.message["content"] for h in await first.history(ALICE)] == [
        "be brief",
        "hi there",
        "hello",
    ]
    # ... a delete and a new session under the same name: nothing of the old one.
    assert await second.delete_session(ALICE)
    assert await first.history(ALICE) == []
    await second.record_exchange(ALICE, [U1], A1, req())
    fresh = await first.history(ALICE)
    assert [h.message["content"] for h in fresh] == ["hi", "hello"]
    assert fresh == await second.history(ALICE)


async def test_a_cached_history_is_served_only_after_the_version_is_checked(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    first, _ = two
    await first.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    once = await first.history(ALICE)
    # Written behind every store's back (another deployment, an operator): the version
    # moves, so the cache is not trusted.
    await first.pool.execute(
        "UPDATE items SET message_json = $1 WHERE id = $2",
        '{"role":"user","content":"changed"}',
        once[1].id,
    )
    assert (await first.history(ALICE))[1].message["content"] == "hi"  # same version: cached
    await first.pool.execute("UPDATE sessions SET version = version + 1")
    assert (await first.history(ALICE))[1].message["content"] == "hi"  # head unchanged: kept
    await first.pool.execute(
        "UPDATE sessions SET head_item_id = $1, version = version + 1", once[1].id
    )
    assert [h.id for h in await first.history(ALICE)] == [once[0].id, once[1].id]


async def test_a_history_server_turn_shares_the_cached_items_others_get_copies(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    """Parsed once: a reader that only reads (``shared``) gets the cached items
    themselves, turn after turn; any other caller copies it may change."""
    first, _ = two
    await first.record_exchange(ALICE, [SYSTEM, U1], A1, req())
    shared = await first.history(ALICE, shared=True)
    again = await first.history(ALICE, shared=True)
    assert [a is b for a, b in zip(shared, again, strict=True)] == [True, True, True]
    own = await first.history(ALICE)
    assert own == shared and not any(a is b for a, b in zip(own, shared, strict=True))
    own[1].message["content"] = "changed by its caller"
    assert (await first.history(ALICE, shared=True))[1].message["content"] == "hi"
    # The role is one string for the column and the message.
    assert all(item.role is item.message["role"] for item in again)
