"""Summary single-flight across instances: claim a range before calling the summarizer.

The summary service (proxy/context/summaries.py) keeps one call per range
inside its process. With shared ``Flights`` (Redis), it also claims the range
for all instances. Whoever claims it makes the summary; an instance that
finds it claimed waits for the summary to reach the store, polling it, at
most the summarizer's timeout. If the claim disappears without a summary
(the maker failed, or was killed and its lease ran out), the waiter claims
the range itself. With Redis unreachable, the range is made here without a
claim: the store still keeps one summary per range (the first writer wins),
so the worst case is a duplicate summarizer call, never a second summary.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence

from policies.types import SummaryTask
from proxy.context.summarizer import SummaryFailed
from proxy.coordination.base import CoordinationError, Flights
from proxy.store.base import SessionRef, Store, StoredSummary
from proxy.telemetry.logging import get_logger

log = get_logger()

_POLL_S = 0.05
# The claim outlives the summarizer's own timeout by this much (then it expires).
_LEASE_MARGIN_S = 10.0


class Claim:
    """This instance makes the range (``id`` None: made without a claim, Redis being down)."""

    def __init__(self, flights: Flights, key: str, claim_id: str | None) -> None:
        self._flights = flights
        self.key = key
        self.id = claim_id

    async def done(self) -> None:
        if self.id is not None:
            await self._flights.done(self.key, self.id)


def range_key(ref: SessionRef, task: SummaryTask, end_path: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in (ref.tenant, ref.key, str(task.start_unit), end_path):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


async def claim_range(
    flights: Flights,
    store: Store,
    ref: SessionRef,
    task: SummaryTask,
    paths: Sequence[str],
    timeout: float,
) -> Claim | StoredSummary | SummaryFailed:
    """A claim to make the range; or the summary another instance made; or why neither."""
    end = paths[task.end - 1]
    key = range_key(ref, task, end)
    deadline = time.monotonic() + timeout
    while True:
        try:
            claim_id = await flights.claim(key, timeout + _LEASE_MARGIN_S)
        except CoordinationError as exc:
            log.warning("coordination_unavailable", op="summary_claim", error=repr(exc))
            return Claim(flights, key, None)
        if claim_id is not None:
            return Claim(flights, key, claim_id)
        # Another instance makes it: wait for it in the store.
        while True:
            await asyncio.sleep(_POLL_S)
            # The maker stores the summary before it drops its claim: look first.
            found = await _stored(store, ref, paths, task, end)
            if found is not None:
                return found
            if time.monotonic() >= deadline:
                return SummaryFailed("timeout", "another instance is making it; not stored in time")
            try:
                if not await flights.running(key):
                    break  # the maker gave up or died: claim the range here
            except CoordinationError:
                return Claim(flights, key, None)
        found = await _stored(store, ref, paths, task, end)
        if found is not None:
            return found


async def _stored(
    store: Store, ref: SessionRef, paths: Sequence[str], task: SummaryTask, end: str
) -> StoredSummary | None:
    for found in await store.summaries_for(ref, paths[: task.end]):
        if (found.covers_path_hash, found.start_unit) == (end, task.start_unit):
            return found
    return None
