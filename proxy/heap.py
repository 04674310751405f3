"""The heap the process freed, handed back to the OS: after loading, and once idle after a burst.

glibc keeps what the process frees mapped for reuse: serving frees as it goes
(request bodies, replies, whatever the caches evict) and so does loading the
tokenizers (hundreds of thousands of short-lived objects), but the RSS stays
at the peak's until something asks malloc to return the free pages
(``malloc_trim``). Trimming walks the heap (2 to 4 ms over ~100 MB, timed by
hand), so it is done only where nothing waits: once the encodings are loaded
(tokens.preload_encodings), and by :class:`IdleTrim` when requests were
served and then none came for ``IDLE_S``, at most once per ``MIN_GAP_S``.
bench/history.py, memory, main at 4b66289 (hand-run: malloc_trim called from
a signal handler after each step): 1 MB returned after 1,000 sessions of 20
turns, 5 MB after 5,000, so the RSS grows less with the sessions served.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections.abc import Callable

from proxy.background import LoopTask

# Quiet for this long (no request started, none in flight, no write pending): at rest.
IDLE_S = 0.25
# Trims at most this often, so traffic with short gaps does not pay for a walk each gap.
MIN_GAP_S = 10.0


def release_freed_heap() -> bool:
    """Return the heap's free pages to the OS (glibc); False where there is no malloc_trim."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to return
        return False
    trim(0)
    return True


class IdleTrim:
    """Trims once the proxy is at rest after serving: ``served()`` (requests counted so
    far) has not moved for ``IDLE_S`` and ``busy()`` (requests in flight, writes
    pending) is false; at most once per ``MIN_GAP_S``, never while idle all along."""

    def __init__(
        self,
        served: Callable[[], float],
        busy: Callable[[], bool],
        *,
        trim: Callable[[], bool] | None = None,
        idle_s: float = IDLE_S,
        min_gap_s: float = MIN_GAP_S,
    ) -> None:
        self._served = served
        self._busy = busy
        self._trim = trim
        self._idle_s = idle_s
        self._min_gap_s = min_gap_s
        self._loop_task = LoopTask("idle-trim", self._loop)
        # What served() was at the last look and at the last trim.
        self._seen = served()
        self._trimmed_at = self._seen
        self._last_trim = float("-inf")
        self.trims = 0

    def check(self, now: float) -> bool:
        """One look (every ``idle_s``); True if it trimmed."""
        served = self._served()
        quiet = served == self._seen
        self._seen = served
        if not quiet or served == self._trimmed_at or self._busy():
            return False
        if now - self._last_trim < self._min_gap_s:
            return False
        self._trimmed_at, self._last_trim = served, now
        self.trims += 1
        # Looked up here, not bound at definition: tests replace the module's function.
        return (self._trim or release_freed_heap)()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._idle_s)
            self.check(time.monotonic())

    def start(self) -> None:
        self._loop_task.start()

    async def stop(self) -> None:
        await self._loop_task.stop()
