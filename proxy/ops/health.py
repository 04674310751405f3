"""Health: ``/healthz`` (the process answers) and ``/readyz`` (it should be sent traffic).

``/readyz`` is 200 once the store is open, the token encodings are loaded
(in a thread, after the socket is bound) and a read on the store succeeds
within ``PROBE_TIMEOUT_S``; 503 before start-up finished, while the store does not
answer, and from the moment a SIGTERM starts draining the process (so a load
balancer stops sending new requests while the ones in flight finish).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.store.base import SessionRef

PROBE_TIMEOUT_S = 2.0
# A session nobody can have (tenants are hashes): the probe reads, never writes.
_PROBE = SessionRef("-", "ctxproxy-readyz")


@dataclass
class Lifecycle:
    """Where the process is in its life; one per app (``app.state.lifecycle``)."""

    started: bool = False
    draining: bool = False
    # Set with ``started``: requests that came early wait on it (WarmUpGate).
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def set_started(self) -> None:
        self.started = True
        self.ready.set()


# Answered while warming up: they say how the process is, they need nothing loaded.
_UNGATED = frozenset({"/healthz", "/readyz", "/metrics"})


class WarmUpGate:
    """Requests that arrive before the warm-up finished wait for it (a second at most).

    Otherwise the first requests would load the token encodings themselves, on
    the event loop, stalling every other request (and, across instances, letting
    a session lock's lease lapse). Once warm, the cost is one attribute check.
    """

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.lifecycle.started and scope["type"] == "http" and scope["path"] not in _UNGATED:
            await self.lifecycle.ready.wait()
        await self.app(scope, receive, send)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    lifecycle: Lifecycle = request.app.state.lifecycle
    if lifecycle.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if not lifecycle.started:
        return JSONResponse({"status": "starting"}, status_code=503)
    store = request.app.state.runtime.store
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            await store.get_session(_PROBE)
    except TimeoutError:
        error = f"no answer within {PROBE_TIMEOUT_S:g} s"
        return JSONResponse({"status": "unavailable", "store": error}, status_code=503)
    except Exception as exc:  # any failure of any backend means the same: not ready
        error = f"{type(exc).__name__}: {exc}"
        return JSONResponse({"status": "unavailable", "store": error}, status_code=503)
    return JSONResponse({"status": "ready", "store": "ok"})
