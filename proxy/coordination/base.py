"""The coordination protocols: what an instance must agree on with the others.

``SessionLocks`` serializes ``history: server`` requests on one session: the
next request must read this one's reply. ``acquire`` returns a *fencing
token* (or None in one process, where a lock can never be lost): it grows
with every acquisition of the session's lock, the request row carries it
(``detail.fence``), and a shared store rejects a write whose token is older
than one it already stored, so a holder whose lease ran out (a long pause, a
partition) can never overwrite what the next holder wrote.

``Flights`` makes one summary per range across instances: the first to
``claim`` a key makes it; the others wait for it in the store.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from proxy.errors import ProxyError
from proxy.store.base import SessionRef


class CoordinationError(Exception):
    """The coordination service failed to answer (what a backend's own errors become)."""


class CoordinationUnavailable(ProxyError):
    """Redis is unreachable: a request that needs the session's lock is refused, not risked."""

    status = 503
    type = "server_error"
    code = "coordination_unavailable"


class SessionLockTimeout(ProxyError):
    """The session stayed locked longer than ``coordination.lock_wait``."""

    status = 503
    type = "server_error"
    code = "session_busy"


# Told each new fencing token before the holder reads the session (a shared SQL
# store's ``advance_fence``): writes with older tokens are refused from then on.
FenceHook = Callable[[SessionRef, int], Awaitable[None]]


class SessionLocks(Protocol):
    async def acquire(self, ref: SessionRef) -> int | None:
        """Hold the session's lock; its fencing token (None: a lock that cannot be lost)."""
        ...

    def release(self, ref: SessionRef) -> None:
        """Let the next waiter in (what Redis must be told is sent in the background)."""
        ...


class Flights(Protocol):
    async def claim(self, key: str, lease_s: float) -> str | None:
        """Become the one making ``key``: a claim id, or None when another holds it.

        Raises ``CoordinationError`` when the service cannot answer.
        """
        ...

    async def running(self, key: str) -> bool:
        """Whether someone holds ``key`` (a crashed holder's claim expires with its lease)."""
        ...

    async def done(self, key: str, claim: str) -> None: ...


class Coordinator(Protocol):
    #: "in-process" or "redis", for ``proxy check``, logs and metrics.
    name: str

    @property
    def locks(self) -> SessionLocks: ...

    @property
    def flights(self) -> Flights | None:
        """None: single-flight within this process only (proxy/context/summaries.py)."""
        ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...
