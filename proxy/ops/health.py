"""Health: ``/healthz`` (the process answers) and ``/readyz`` (it should be sent traffic).

``/readyz`` is 200 once the store is open, the token encodings are loaded
(in a thread, after the socket is bound) and a read on the store succeeds
within ``PROBE_TIMEOUT_S``; 503 before start-up finished, while the store does not
answer, and from the moment a SIGTERM starts draining the process (so a load
balancer stops sending new requests while the ones in flight finish).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.store.base import SessionRef

PROBE_TIMEOUT_S = 2.0
# A session nobody can have (tenants are hashes): the probe reads, never writes.
_PROBE = SessionRef("-", "ctxproxy-readyz")


@dataclass
class Lifecycle:
    """Where the process is in its life; one per app (``app.state.lifecycle``)."""

    started: bool = False
    draining: bool = False


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
