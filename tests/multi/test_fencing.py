"""A holder whose lease lapsed cannot write after the next holder began.

Real Redis locks in front of each shared store (PostgreSQL, Redis): the store
learns each new holder's token when the lock is taken (``advance_fence``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from proxy.coordination.redis import RedisCoordinator
from proxy.store.base import FencedOut
from proxy.store.postgres import PostgresStore
from proxy.store.redis import RedisStore
from tests.servers import RUN, require_postgres, require_redis
from tests.stores import ALICE, ScratchPostgresStore, ScratchRedisStore, msg, req

U1, A1 = msg("user", "hi"), msg("assistant", "hello")


Shared = PostgresStore | RedisStore


@pytest.fixture(params=["postgres", "redis"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Shared, Shared]]:
    """Two instances' stores over the same data."""
    first: Shared
    second: Shared
    if request.param == "postgres":
        first = ScratchPostgresStore(require_postgres(), pool_size=2)
        await first.open()
        second = PostgresStore(require_postgres(), pool_size=2, schema=first.schema)
    else:
        first = ScratchRedisStore(require_redis())
        await first.open()
        second = RedisStore(require_redis(), prefix=first.prefix)
    await second.open()
    yield first, second
    await second.close()
    await first.close()


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    name = f"ctxtest:{RUN}:{uuid.uuid4().hex[:8]}"
    yield name
    client = Redis.from_url(require_redis())
    keys = [k async for k in client.scan_iter(match=f"{name}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def test_a_stalled_holders_late_write_is_refused_whoever_writes_first(
    stores: tuple[Shared, Shared], prefix: str
) -> None:
    store_a, store_b = stores
    await store_a.record_exchange(ALICE, [U1], A1, req())
    url = require_redis()
    a = RedisCoordinator(url, prefix=prefix, lease_s=1.0, fence=store_a.advance_fence)
    b = RedisCoordinator(url, prefix=prefix, lease_s=1.0, wait_s=5.0, fence=store_b.advance_fence)
    try:
        token_a = await a.locks.acquire(ALICE)
        history_a = await store_a.history(ALICE)
        # a stalls (its loop blocked): no renewal, the lease lapses, b takes the lock.
        for held in a.locks._held.values():
            held.renewer.cancel()
        token_b = await b.locks.acquire(ALICE)
        assert token_b > token_a
        history_b = await store_b.history(ALICE)
        assert history_b == history_a  # both read the same chain: a's write would fork it
        # a wakes up and writes first: refused, nothing of it stored.
        late = req(detail={"fence": token_a})
        with pytest.raises(FencedOut):
            await store_a.record_exchange(
                ALICE, [U1, A1, msg("user", "from a")], msg("assistant", "ra"), late
            )
        assert await store_a.request(late.id) is None
        await store_b.record_exchange(
            ALICE,
            [U1, A1, msg("user", "from b")],
            msg("assistant", "rb"),
            req(detail={"fence": token_b}),
        )
        b.locks.release(ALICE)
        contents = [h.message["content"] for h in await store_a.history(ALICE)]
        assert contents == ["hi", "hello", "from b", "rb"]
        info = await store_a.get_session(ALICE)
        assert info is not None and info.item_count == 4  # no side branch either
    finally:
        await a.close()
        await b.close()
