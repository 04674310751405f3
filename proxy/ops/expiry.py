"""session.ttl: delete idle sessions and everything that belongs to them, in the background.

The sweep runs every tenth of the TTL (between ``MIN_INTERVAL`` and
``MAX_INTERVAL``) and reads the TTL from the runtime's current config each
time, so a reload that sets, changes or removes it takes effect at the next
sweep. SQLite reuses the pages deleted rows free, so a database under a TTL
levels off at the size of its live sessions instead of growing without bound.
A sweep is a deletion like any other: it purges the deleted words from every
copy the store keeps (docs/operations/deletion.md).
"""

from __future__ import annotations

import asyncio
import time

from proxy.background import LoopTask
from proxy.runtime import Runtime
from proxy.telemetry.logging import get_logger

log = get_logger()

MIN_INTERVAL = 0.05
MAX_INTERVAL = 300.0
# With no TTL configured, how often to look whether a reload set one.
IDLE_INTERVAL = 60.0


def sweep_interval(ttl_s: float | None) -> float:
    if ttl_s is None:
        return IDLE_INTERVAL
    return min(MAX_INTERVAL, max(MIN_INTERVAL, ttl_s / 10))


class Expiry:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._loop_task = LoopTask("session-expiry", self._loop)

    async def sweep(self, now: float | None = None) -> int:
        """Delete the sessions idle for longer than the TTL; return how many."""
        ttl = self.runtime.config.session.ttl_s
        if ttl is None:
            return 0
        cutoff = (time.time() if now is None else now) - ttl
        deleted = await self.runtime.store.delete_idle_sessions(cutoff)
        if deleted:
            self.runtime.metrics.sessions_expired.inc((), deleted)
            log.info("sessions_expired", count=deleted, ttl_s=ttl)
        return deleted

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(sweep_interval(self.runtime.config.session.ttl_s))
            try:
                await self.sweep()
            except Exception as exc:
                # The loop is a boundary: whatever one sweep hits (a locked or
                # briefly unavailable database), log it and let the next one retry.
                log.error("session_expiry_failed", error=repr(exc), exc_info=exc)

    def start(self) -> None:
        self._loop_task.start()

    async def stop(self) -> None:
        await self._loop_task.stop()
