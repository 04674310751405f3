"""The coordination contract, on the in-process default and the real Redis (never mocked).

Each test's Redis keys live under a prefix of this run, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from redis.asyncio import Redis

from proxy.context.calibration import Calibration
from proxy.coordination.base import (
    CoordinationError,
    CoordinationUnavailable,
    SessionLocks,
    SessionLockTimeout,
)
from proxy.coordination.calibration_share import CalibrationShare
from proxy.coordination.local import LocalCoordinator
from proxy.coordination.redis import RedisCoordinator
from proxy.store.base import SessionRef
from tests.servers import RUN, require_redis

REF = SessionRef("tenant", "chat")
# Nothing listens here: Redis "down".
DEAD_REDIS = "redis://127.0.0.1:1/0"


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    url = require_redis()
    name = f"ctxtest:{RUN}:{uuid.uuid4().hex[:8]}"
    yield name
    client = Redis.from_url(url)
    keys = [k async for k in client.scan_iter(match=f"{name}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
async def instances(prefix: str) -> AsyncIterator[Callable[..., RedisCoordinator]]:
    """Coordinators for separate instances: each its own client, same Redis and prefix."""
    made: list[RedisCoordinator] = []

    def make(**options: float) -> RedisCoordinator:
        c = RedisCoordinator(require_redis(), prefix=prefix, **options)  # type: ignore[arg-type]
        made.append(c)
        return c

    yield make
    for c in made:
        await c.close()


async def _counter_race(locks: list[SessionLocks], n: int) -> tuple[int, list[int | None]]:
    """n tasks, spread over ``locks``, each read-yield-write a shared counter under the lock."""
    value = 0
    tokens: list[int | None] = []

    async def bump(lock: SessionLocks) -> None:
        nonlocal value
        tokens.append(await lock.acquire(REF))
        try:
            seen = value
            await asyncio.sleep(0.001)
            value = seen + 1
        finally:
            lock.release(REF)

    await asyncio.gather(*(bump(locks[i % len(locks)]) for i in range(n)))
    return value, tokens


async def test_in_process_locks_serialize_one_session() -> None:
    coordinator = LocalCoordinator()
    value, tokens = await _counter_race([coordinator.locks], 30)
    assert value == 30
    assert tokens == [None] * 30  # one process: a lock that cannot be lost needs no fence


async def test_redis_locks_serialize_one_session_across_instances(
    instances: Callable[..., RedisCoordinator],
) -> None:
    a, b = instances(), instances()
    value, tokens = await _counter_race([a.locks, b.locks], 40)
    assert value == 40  # no lost update: never two holders at once
    assert all(isinstance(t, int) for t in tokens)
    assert len(set(tokens)) == 40


async def test_fencing_tokens_grow_with_every_acquisition(
    instances: Callable[..., RedisCoordinator],
) -> None:
    a, b = instances(), instances()
    seen = []
    for locks in (a.locks, b.locks, a.locks, b.locks):
        seen.append(await locks.acquire(REF))
        locks.release(REF)
        await asyncio.sleep(0.01)  # the release reaches Redis in the background
    assert seen == sorted(seen) and len(set(seen)) == 4


async def test_other_sessions_are_not_blocked(instances: Callable[..., RedisCoordinator]) -> None:
    a, b = instances(lease_s=5.0), instances(wait_s=0.2)
    await a.locks.acquire(REF)
    other = SessionRef(REF.tenant, "another")
    assert isinstance(await asyncio.wait_for(b.locks.acquire(other), 1.0), int)
    b.locks.release(other)
    a.locks.release(REF)


async def test_a_crashed_holders_lock_expires_after_its_lease(
    instances: Callable[..., RedisCoordinator],
) -> None:
    crashed, survivor = instances(lease_s=1.0), instances(wait_s=10.0)
    first = await crashed.locks.acquire(REF)
    # The instance dies: it neither renews nor releases (kill -9).
    for held in crashed.locks._held.values():
        held.renewer.cancel()
    started = time.monotonic()
    second = await survivor.locks.acquire(REF)
    waited = time.monotonic() - started
    assert 0.5 < waited < 1.6
    assert second > first
    survivor.locks.release(REF)


async def test_a_held_lock_is_renewed_past_its_lease(
    instances: Callable[..., RedisCoordinator],
) -> None:
    holder, waiter = instances(lease_s=1.0), instances(wait_s=0.3)
    await holder.locks.acquire(REF)
    await asyncio.sleep(1.5)  # longer than the lease: renewed meanwhile
    with pytest.raises(SessionLockTimeout):
        await waiter.locks.acquire(REF)
    holder.locks.release(REF)
    await asyncio.sleep(0.05)
    assert isinstance(await waiter.locks.acquire(REF), int)
    waiter.locks.release(REF)


async def test_redis_down_refuses_the_lock_with_a_503() -> None:
    coordinator = RedisCoordinator(DEAD_REDIS, prefix=f"ctxtest:{RUN}")
    await coordinator.open()  # starts anyway (degraded), says so in the log
    try:
        with pytest.raises(CoordinationUnavailable) as info:
            await coordinator.locks.acquire(REF)
        assert info.value.status == 503 and info.value.code == "coordination_unavailable"
        # The local queue was released: the next request is refused too, not stuck.
        with pytest.raises(CoordinationUnavailable):
            await asyncio.wait_for(coordinator.locks.acquire(REF), 5.0)
        with pytest.raises(CoordinationError):
            await coordinator.flights.claim("k", 1.0)
    finally:
        await coordinator.close()


async def test_one_claim_per_flight_across_instances(
    instances: Callable[..., RedisCoordinator],
) -> None:
    a, b = instances(), instances()
    claim = await a.flights.claim("range-1", 5.0)
    assert claim is not None
    assert await b.flights.claim("range-1", 5.0) is None
    assert await b.flights.running("range-1")
    await b.flights.done("range-1", "not-the-owner")  # someone else's claim is left alone
    assert await a.flights.running("range-1")
    await a.flights.done("range-1", claim)
    assert not await b.flights.running("range-1")
    assert await b.flights.claim("range-1", 5.0) is not None


async def test_a_crashed_makers_claim_expires(instances: Callable[..., RedisCoordinator]) -> None:
    a, b = instances(), instances()
    assert await a.flights.claim("range-2", 0.3) is not None
    await asyncio.sleep(0.4)
    assert not await b.flights.running("range-2")
    assert await b.flights.claim("range-2", 5.0) is not None


async def test_every_instance_applies_the_same_calibration(prefix: str) -> None:
    client = Redis.from_url(require_redis())
    cal_a, cal_b = Calibration(min_samples=2), Calibration(min_samples=2)
    share_a = CalibrationShare(client, prefix, cal_a, "a")
    share_b = CalibrationShare(client, prefix, cal_b, "b")
    cal_a.shared = cal_b.shared = True
    for _ in range(3):
        cal_a.observe("m", 100, 150)  # a sees the upstream bill 1.5x
    cal_b.observe("m", 100, 110)  # b alone would not be calibrated yet
    assert cal_a.factor("m") == cal_b.factor("m") == 1.0  # shared: only adopted factors
    await share_a.sync()
    await share_b.sync()
    await share_a.sync()
    assert (
        cal_a.factor("m")
        == cal_b.factor("m")
        == pytest.approx(
            (cal_a.models["m"].reported + cal_b.models["m"].reported)
            / (cal_a.models["m"].local + cal_b.models["m"].local)
        )
    )
    assert 1.0 < cal_a.factor("m") < 1.5
    await client.aclose()
