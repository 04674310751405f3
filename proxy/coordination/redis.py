"""Several instances through one Redis: session locks, summary single-flight, calibration.

Keys live under ``<key_prefix>:`` (locks, fences, flights, calibration), so
several deployments (or test runs) can share one Redis. What happens while
Redis is unreachable (the degraded mode,
docs/operations/several-instances.md): ``history: server`` requests are refused with a 503
(``coordination_unavailable``) before anything is read or sent; client-history
requests are served as usual (their writes are idempotent per message, and
PostgreSQL serializes each session's transactions on its row); summaries are
made without the cross-instance claim (the store still keeps one per range);
calibration keeps its last shared factors.
"""

from __future__ import annotations

import os
import socket
import uuid

from redis.asyncio import Redis
from redis.exceptions import RedisError

from proxy.context.calibration import Calibration
from proxy.coordination.base import FenceHook
from proxy.coordination.calibration_share import CalibrationShare
from proxy.coordination.redis_flights import RedisFlights
from proxy.coordination.redis_locks import RedisSessionLocks
from proxy.telemetry.logging import get_logger

log = get_logger()


class RedisCoordinator:
    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "ctxproxy",
        lease_s: float = 15.0,
        wait_s: float = 120.0,
        calibration: Calibration | None = None,
        calibration_interval: float = 2.0,
        fence: FenceHook | None = None,
    ) -> None:
        # This instance's name in owners, claims and the calibration hash.
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.client: Redis = Redis.from_url(
            url, socket_timeout=2.0, socket_connect_timeout=2.0, health_check_interval=10
        )
        self.prefix = prefix
        self.locks = RedisSessionLocks(
            self.client, prefix, lease_s=lease_s, wait_s=wait_s, instance=self.instance, fence=fence
        )
        self.flights = RedisFlights(self.client, prefix, self.instance)
        self._share = (
            None
            if calibration is None
            else CalibrationShare(
                self.client, prefix, calibration, self.instance, interval=calibration_interval
            )
        )

    async def open(self) -> None:
        # Start even if Redis is down (the degraded mode), but say so at once.
        try:
            await self.client.ping()
        except (RedisError, OSError) as exc:
            log.warning("coordination_unavailable", op="start", error=repr(exc))
        if self._share is not None:
            self._share.start()

    async def close(self) -> None:
        if self._share is not None:
            await self._share.stop()
        await self.locks.close()
        await self.client.aclose()
