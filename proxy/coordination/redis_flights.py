"""Summary single-flight across instances: one claim per range in Redis, with a lease.

The first instance to ``claim`` a range makes the summary; the others see
the claim and wait for the summary to appear in the store (the summary
service polls it). A claim expires with its lease, so a crashed maker does
not hold a range forever; ``done`` deletes it only if it is still the
maker's own.
"""

from __future__ import annotations

import uuid

from redis.asyncio import Redis
from redis.exceptions import RedisError

from proxy.coordination.base import CoordinationError
from proxy.coordination.redis_locks import RELEASE
from proxy.telemetry.logging import get_logger

log = get_logger()


class RedisFlights:
    def __init__(self, client: Redis, prefix: str, instance: str) -> None:
        self._client = client
        self._prefix = prefix
        self._instance = instance
        self._release = client.register_script(RELEASE)

    def _key(self, key: str) -> str:
        return f"{self._prefix}:flight:{key}"

    async def claim(self, key: str, lease_s: float) -> str | None:
        """A claim id, or None when another instance holds the range.

        Raises ``CoordinationError`` when Redis is down: the caller makes the
        summary itself then (the store keeps one per range, first writer wins).
        """
        claim = f"{self._instance}:{uuid.uuid4().hex}"
        try:
            ok = await self._client.set(self._key(key), claim, nx=True, px=int(lease_s * 1000))
        except (RedisError, OSError) as exc:
            raise CoordinationError(repr(exc)) from exc
        return claim if ok else None

    async def running(self, key: str) -> bool:
        try:
            return bool(await self._client.exists(self._key(key)))
        except (RedisError, OSError) as exc:
            raise CoordinationError(repr(exc)) from exc

    async def done(self, key: str, claim: str) -> None:
        try:
            await self._release(keys=[self._key(key)], args=[claim])
        except (RedisError, OSError) as exc:
            log.warning("summary_claim_release_failed", error=repr(exc))
