"""uvicorn's settings for slow and greedy clients, and a header-read timeout it lacks.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and caps
connections plus requests in flight (``limit_concurrency``: a 503 past it),
but has no deadline for a request's headers: its keep-alive timer is
cancelled by the first byte received, so a client trickling one header byte
a second holds its socket forever. ``GuardedHttpTools`` adds that deadline:
the headers must be complete within ``server.header_timeout_s`` of the
connection opening or the previous response ending, else the connection is
closed. Body reads have their own idle deadline (``proxy/http/body.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.config.model import ServerConfig


class GuardedHttpTools(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not cycle.response_complete:
            return  # a request is being served (a pipelined one): not a slow header
        if not self.transport.is_closing():
            self.transport.close()


def uvicorn_options(server: ServerConfig) -> dict[str, Any]:
    """The uvicorn.Config keywords that guard against slow clients, from ``server``."""
    protocol = type(
        "GuardedHttpTools", (GuardedHttpTools,), {"header_timeout_s": server.header_timeout_s}
    )
    return {
        "http": protocol,
        "timeout_keep_alive": server.keep_alive_s,
        "limit_concurrency": server.max_connections,
    }
