"""One instance: the session locks are asyncio locks, single-flight is the summary service's own."""

from __future__ import annotations

from proxy.coordination.base import Flights
from proxy.http.sessions import SessionLocks


class LocalCoordinator:
    """The default: nothing to agree with, nothing to open."""

    name = "in-process"

    def __init__(self) -> None:
        self.locks = SessionLocks()
        self.flights: Flights | None = None

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None
