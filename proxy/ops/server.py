"""Serving a config: the store checked first, uvicorn, the start, drain and stop lines.

- The store is checked before anything binds: a bad ``store.path`` (a folder
  that cannot be made, a file that is not a database) is one
  ``store_open_failed`` line naming the path and the reason, and exit code 2,
  never a traceback.
- ``proxy_started`` (with the address) is logged after the socket is bound,
  so a port already in use gives uvicorn's error line and exit code 1 with no
  claim of having started.
- SIGTERM drains: ``/readyz`` answers 503 for ``drain_s`` seconds while
  everything else is still served (a load balancer stops sending traffic),
  then uvicorn's graceful shutdown lets requests in flight finish. SIGINT
  (Ctrl-C) and a second SIGTERM stop at once, gracefully.
- ``proxy_stopped`` is the last line, with the uptime.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import signal
import sqlite3
import time
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from proxy.config.model import Config
from proxy.http.server import uvicorn_options
from proxy.ops.health import Lifecycle
from proxy.store.backends import backend_name
from proxy.store.sqlite_items import PAGE_SIZE
from proxy.telemetry.logging import get_logger

log = get_logger()

DEFAULT_DRAIN_S = 2.0


def store_problem(config: Config) -> str | None:
    """Why the SQLite store cannot be opened, or None; checked before the server starts."""
    if config.store.url:
        return None  # a shared store (PostgreSQL, Redis) reports its own connection errors
    path = Path(config.store.path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(path)
        try:
            # This makes the file when it is new: with the store's page size.
            con.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            con.execute("PRAGMA journal_mode = WAL").fetchall()
        finally:
            con.close()
    except (OSError, sqlite3.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return reason
    return None


def process_age_s() -> float | None:
    """Seconds since this process started (Linux), None elsewhere: the start-up time."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(uptime - ticks / os.sysconf("SC_CLK_TCK"), 2)


class Server(uvicorn.Server):
    """uvicorn's server, with the proxy's own start line, drain on SIGTERM and stop line."""

    def __init__(
        self,
        config: uvicorn.Config,
        proxy: Config,
        lifecycle: Lifecycle,
        drain_s: float,
        described: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(config)
        self.proxy = proxy
        # What proxy_started says besides the address (store, coordination).
        self.described = described or {}
        self.lifecycle = lifecycle
        self.drain_s = drain_s
        self._drain_until: float | None = None
        self.started_at = time.monotonic()
        self.stop_signal: str | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.should_exit or not self.servers:
            return  # the lifespan or the bind failed: uvicorn said why
        bound = [s.getsockname() for server in self.servers for s in (server.sockets or ())]
        host, port = bound[0][0], bound[0][1]
        config = self.proxy
        log.info(
            "proxy_started",
            url=f"http://{host}:{port}",
            host=host,
            port=port,
            routes=len(config.routes),
            config=config.source,
            **self.described,
            process_age_s=process_age_s(),
        )

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stop_signal = signal.Signals(sig).name
        draining = self._drain_until is not None
        if sig == signal.SIGTERM and not draining and self.drain_s > 0 and self.started:
            self.lifecycle.draining = True
            self._drain_until = time.monotonic() + self.drain_s
            log.info("proxy_draining", signal=self.stop_signal, drain_s=self.drain_s)
            return
        self.lifecycle.draining = True
        super().handle_exit(sig, frame)

    async def _serve(self, sockets: Any = None) -> None:
        await super()._serve(sockets)
        # Here, inside uvicorn's signal capture: it re-raises the signal that
        # stopped it once serve() returns, ending the process as that signal would.
        if self.started:
            log.info(
                "proxy_stopped",
                signal=self.stop_signal,
                uptime_s=round(time.monotonic() - self.started_at, 1),
            )

    async def on_tick(self, counter: int) -> bool:
        if self._drain_until is not None and time.monotonic() >= self._drain_until:
            return True
        return await super().on_tick(counter)


def serve(
    config: Config,
    host: str | None = None,
    port: int | None = None,
    *,
    drain_s: float = DEFAULT_DRAIN_S,
) -> int:
    """Run the proxy until it is stopped; the process's exit code."""
    from proxy.app import create_app

    problem = store_problem(config)
    if problem is not None:
        log.error("store_open_failed", path=config.store.path, error=problem)
        return 2
    app = create_app(config)
    # What is built by now lives as long as the process: move it out of the
    # collector's sight, and collect less often. Each full collection would
    # otherwise pause the event loop for 10 ms or more. Here, not in
    # create_app: a process that builds many apps (the tests) must not
    # freeze each one's garbage.
    gc.collect()
    gc.freeze()
    gc.set_threshold(7000, 10, 10)
    server = Server(
        uvicorn.Config(
            app,
            host=host or config.server.host,
            port=port or config.server.port,
            # The fast event loop and HTTP parser, named: "auto" would fall back to
            # the slow ones silently. uvloop is not installed on Windows.
            loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
            # uvicorn's own lines go through structlog (configure_logging), as JSON.
            log_config=None,
            log_level=config.logging.level,
            access_log=False,  # request_completed is the access log
            server_header=False,
            date_header=False,
            timeout_graceful_shutdown=30,
            # httptools with a header deadline; keep-alive and connection limits.
            **uvicorn_options(config.server),
        ),
        config,
        app.state.lifecycle,
        drain_s,
        {
            "store": backend_name(config.store.url),
            "coordination": app.state.runtime.coordinator.name,
        },
    )
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits on a bind or lifespan failure, having logged why
        code = exc.code if isinstance(exc.code, int) else 1
        log.error("proxy_start_failed", exit_code=code)
        return code
    return 0
