"""Real servers on 127.0.0.1 for end-to-end tests: the proxy under uvicorn and fakes.

Everything runs on one event loop in a background thread, so tests use the
official synchronous `openai` client exactly as an application would.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from aiohttp import web

from proxy.app import create_app
from proxy.config.loader import parse_config
from proxy.config.model import Config
from proxy.http.server import uvicorn_options

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class AiohttpServer:
    def __init__(self, loop: LoopThread, app: web.Application, **handler: Any) -> None:
        """``handler``: aiohttp's request-handler options (``auto_decompress=False``: a
        fake that records a compressed body as it came)."""
        self.loop = loop
        self.port = free_port()
        self.runner = web.AppRunner(app, **handler)

        async def start() -> None:
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

        loop.run(start())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.loop.run(self.runner.cleanup())


class ProxyServer:
    def __init__(self, loop: LoopThread, config: Config) -> None:
        self.loop = loop
        self.config = config
        self.port = free_port()
        self.app = create_app(config)
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                lifespan="on",
                **uvicorn_options(config.server),
            )
        )
        self.task = asyncio.run_coroutine_threadsafe(self.server.serve(), loop.loop)
        deadline = time.monotonic() + 15
        while not self.server.started:
            if self.task.done():
                self.task.result()
            if time.monotonic() > deadline:
                raise RuntimeError("proxy did not start")
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime

    def drain(self) -> None:
        """Wait until every request is recorded and every background store write has finished.

        A client-held exchange is recorded (row, log line, metrics) right after its
        answer is sent, so a client may read the answer before that.
        """

        async def settled() -> None:
            deadline = time.monotonic() + 15
            while self.runtime.in_flight:
                if time.monotonic() > deadline:
                    raise RuntimeError("requests still in flight after 15 s")
                await asyncio.sleep(0.001)
            await self.runtime.background.drain()

        self.loop.run(settled())

    def stop(self) -> None:
        self.server.should_exit = True
        self.task.result(20)


def make_config(
    upstream_url: str,
    tmp_path: Path,
    *,
    policies: dict[str, Any] | None = None,
    routes: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> Config:
    data: dict[str, Any] = {
        "store": {"path": str(tmp_path / "ctxproxy.db")},
        "upstreams": {"default": {"base_url": f"{upstream_url}/v1", "timeout_s": 5}},
        "routes": routes or [{"match": {"path": "/v1/chat/completions"}, "upstream": "default"}],
        "policies": policies or {},
    }
    data.update(extra or {})
    return parse_config(data)


def query(db: Path, sql: str, *args: Any) -> list[sqlite3.Row]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)
