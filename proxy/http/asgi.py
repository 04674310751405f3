"""Sending a response over raw ASGI, for the hot endpoints (issue 16).

Starlette's ``Response.__call__`` is the same two messages; its
``StreamingResponse`` watches for the client leaving with an anyio task group
per response (uvicorn speaks ASGI 2.3: ``send`` does not raise once the client
is gone), a fifth of a streamed request's CPU here. :func:`respond` sends
either kind, unchanged (the response object only carries status, headers and
body), and watches a stream with one plain task waiting on ``receive``: when
the client disconnects, the relay is cancelled at its next await, as
Starlette's task group would, and the response ends without an error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.errors import ProxyError
from proxy.http.body import error_response


class Endpoint:
    """A Starlette endpoint (``request -> response``) as an ASGI app, answered with
    :func:`respond`; a ProxyError it raises becomes its JSON error, as the app's handler
    would make it."""

    def __init__(self, handler: Callable[[Request], Awaitable[Response]]) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await self.handler(Request(scope, receive, send))
        except ProxyError as error:
            response = error_response(error)
        await respond(response, receive, send)


async def respond(response: Response, receive: Receive, send: Send) -> None:
    """Send ``response`` (its status, raw headers and body, or body iterator); then
    its background task, if any, as Starlette does."""
    if isinstance(response, StreamingResponse):
        await _stream(response, receive, send)
    else:
        start = {"type": "http.response.start", "status": response.status_code}
        start["headers"] = response.raw_headers
        # Head and body in one write.
        with _gathered(receive):
            await send(start)
            await send({"type": "http.response.body", "body": response.body})
    if response.background is not None:
        await response.background()


class _Gathered:
    """A transport stand-in that keeps what is written, for one vectored write later:
    at ``flush``, and (``loop`` given) at the loop's next turn, so what is sent in one
    run of the task (a stream's chunks already at hand) goes out together, and nothing
    waits past the task's next pause."""

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.transport = transport
        self.parts: list[bytes] = []
        self._loop = loop
        self._due = False

    def write(self, data: bytes) -> None:
        self.parts.append(data)
        if self._loop is not None and not self._due:
            self._due = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._due = False
        parts, self.parts = self.parts, []
        if parts and not self.transport.is_closing():
            # One vectored write (uvloop: one writev), the body not copied.
            self.transport.writelines(parts)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


@contextlib.contextmanager
def _gathered(
    receive: Receive, loop: asyncio.AbstractEventLoop | None = None
) -> Iterator[_Gathered | None]:
    """Fewer writes than uvicorn's one per message (a syscall, a segment and a wake-up of
    the client each): the request cycle's transport (uvicorn's ``receive`` is its bound
    method) is stood in for by a :class:`_Gathered` meanwhile, flushed at the end. Any
    other server: sent as they come."""
    cycle: Any = getattr(receive, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None or not hasattr(transport, "writelines"):
        yield None
        return
    gathered = _Gathered(transport, loop)
    cycle.transport = gathered
    try:
        yield gathered
    finally:
        cycle.transport = transport
        gathered.flush()


async def _stream(response: StreamingResponse, receive: Receive, send: Send) -> None:
    task = asyncio.current_task()
    assert task is not None
    state = {"sending": True, "gone": False}

    def left(waiter: asyncio.Future[None]) -> None:
        # The client left while the relay was still running: stop it where it waits.
        if state["sending"] and not waiter.cancelled() and waiter.exception() is None:
            state["gone"] = True
            task.cancel()

    waiter = asyncio.ensure_future(_disconnected(receive))
    waiter.add_done_callback(left)
    chunks = response.body_iterator
    try:
        # The head goes out with the first chunk (as aiohttp's server sends it), at
        # once: the task may run on through every chunk at hand and the exchange's
        # ending before it pauses, and the first event must not wait for those. A
        # head whose first chunk is not at hand goes at the task's first pause; later
        # chunks share a write per turn of the loop.
        with _gathered(receive, asyncio.get_running_loop()) as gathered:
            try:
                start = {"type": "http.response.start", "status": response.status_code}
                start["headers"] = response.raw_headers
                await send(start)
                holding_head = gathered
                async for chunk in chunks:
                    data = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode()
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                    if holding_head is not None:
                        holding_head.flush()
                        holding_head = None
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except asyncio.CancelledError:
                if not state["gone"]:
                    raise
                task.uncancel()
            except OSError:
                pass  # a server speaking ASGI 2.4+: send raises once the client is gone
    finally:
        state["sending"] = False
        waiter.cancel()
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            # A relay stopped between chunks still runs its ending (the exchange's record).
            await aclose()


async def _disconnected(receive: Receive) -> None:
    """Returns once the client is gone (or the response complete: uvicorn says both alike)."""
    while (await receive())["type"] != "http.disconnect":
        pass
