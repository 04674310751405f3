"""Background work: spawned tasks and tracked futures are awaited on drain, failures logged."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from proxy.background import Background


async def test_drain_waits_for_tracked_futures_as_for_tasks():
    background = Background()
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    background.track(future, name="queued-write")
    background.spawn(asyncio.sleep(0.01), name="task")
    loop.call_later(0.05, future.set_result, 1)
    assert background.pending == 2

    await background.drain()

    assert future.done() and background.pending == 0


async def test_a_failed_tracked_future_is_logged_with_its_name():
    background = Background()
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with capture_logs() as logs:
        background.track(future, name="store-req-1")
        future.set_exception(RuntimeError("disk on fire"))
        await background.drain()
    assert [(e["event"], e["task"]) for e in logs] == [("background_task_failed", "store-req-1")]
    assert "disk on fire" in logs[0]["error"]
