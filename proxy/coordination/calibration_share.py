"""Calibration factors shared by every instance, through one Redis hash.

Every ``interval`` seconds each instance writes its decayed sums per model
(``Calibration.state``) under its own field of ``<prefix>:calibration``,
reads every instance's fields, drops those not refreshed for
``stale_after`` (an instance that stopped), and adopts the sum. Every
instance adopts the same sums, so every instance applies the same factor
and so the same budget. While Redis is unreachable the last adopted factors
stay in force.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from proxy.context.calibration import Calibration
from proxy.telemetry.logging import get_logger

log = get_logger()


class CalibrationShare:
    def __init__(
        self,
        client: Redis,
        prefix: str,
        calibration: Calibration,
        instance: str,
        *,
        interval: float = 2.0,
        stale_after: float = 60.0,
    ) -> None:
        self._client = client
        self._key = f"{prefix}:calibration"
        self.calibration = calibration
        self._instance = instance
        self.interval = interval
        self.stale_after = stale_after
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.calibration.shared = True
        self._task = asyncio.get_running_loop().create_task(self._run(), name="calibration-share")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.sync()
            except (RedisError, OSError) as exc:
                log.warning("calibration_share_failed", error=repr(exc))
            await asyncio.sleep(self.interval)

    async def sync(self) -> None:
        """Publish this instance's sums, adopt everyone's (one round trip each way)."""
        now = time.time()
        mine = {"at": now, "models": self.calibration.state()}
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.hset(self._key, self._instance, orjson.dumps(mine))
            pipe.hgetall(self._key)
            _, fields = await pipe.execute()
        states: list[dict[str, tuple[float, float, int]]] = []
        stale: list[Any] = []
        for name, raw in fields.items():
            entry = orjson.loads(raw)
            if now - float(entry.get("at", 0)) > self.stale_after:
                stale.append(name)
                continue
            states.append(
                {m: (float(r), float(loc), int(n)) for m, (r, loc, n) in entry["models"].items()}
            )
        if stale:
            await self._client.hdel(self._key, *stale)
        self.calibration.adopt(states)
