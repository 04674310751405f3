"""Work that runs after the response: tracked so shutdown can wait for it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from proxy.telemetry.logging import get_logger

log = get_logger()


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        # A task of its own, outside the request's cancel scope: a client that
        # goes away must not cancel the write that records what happened.
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.track(task, name=name)
        return task

    def track(self, future: asyncio.Future[Any], *, name: str) -> None:
        """Work already under way elsewhere (a task, a store's queued write): awaited
        by ``drain`` and its failure logged, like a spawned task's."""
        self._tasks.add(future)
        future.add_done_callback(functools.partial(self._done, name))

    def _done(self, name: str, future: asyncio.Future[Any]) -> None:
        self._tasks.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.error("background_task_failed", task=name, error=repr(future.exception()))

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


class LoopTask:
    """A coroutine function run as one named task from ``start`` until ``stop`` (the
    app's periodic work: session expiry, the idle heap trim)."""

    def __init__(self, name: str, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._name = name
        self._run = run
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
