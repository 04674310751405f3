"""Fixtures of the reliability suite: one fake upstream serving chat and Responses."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from tests.fakes.endpoints import FakeEndpoints
from tests.fakes.responses import FakeResponses
from tests.fakes.upstream import FakeUpstream
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config

# Routes on both endpoints: trimmed and pass-through chat, server-held history, Responses.
ROUTES: list[dict[str, Any]] = [
    {
        "match": {"path": "/v1/chat/completions", "headers": {"x-app": "server"}},
        "upstream": "default",
        "policy": "last2",
        "history": "server",
    },
    {
        "match": {"path": "/v1/chat/completions", "headers": {"x-app": "trim"}},
        "upstream": "default",
        "policy": "last2",
    },
    {"match": {"path": "/v1/chat/completions"}, "upstream": "default"},
    {"match": {"path": "/v1/responses"}, "upstream": "default", "policy": "last2"},
    # The Anthropic door, translated to the chat fake.
    {"match": {"path": "/v1/messages"}, "upstream": "default", "policy": "last2"},
    # Every other /v1/... path: relayed unchanged.
    {"match": {"path": "/v1/*"}, "upstream": "default"},
]
POLICIES = {"last2": {"strategy": "trim", "max_turns": 2}}


class Both:
    """A chat fake and a Responses fake behind one port (and, for every other /v1/...
    path, the fake of the endpoints relayed unchanged)."""

    def __init__(self, loop: LoopThread) -> None:
        self.chat = FakeUpstream()
        self.responses = FakeResponses()
        self.endpoints = FakeEndpoints()
        self._hits = 0
        app = self.chat.app()
        app.middlewares.append(self._count)
        for fake in (self.responses, self.endpoints):  # in order: the catch-all last
            for route in fake.app().router.routes():
                app.router.add_route(route.method, route.resource.canonical, route.handler)  # type: ignore[union-attr]
        self.server = AiohttpServer(loop, app)

    @web.middleware
    async def _count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self._hits += 1
        return await handler(request)

    @property
    def url(self) -> str:
        return self.server.url

    def calls(self) -> int:
        """Requests that reached this upstream, routed or not (a relayed answer is the
        upstream's, even aiohttp's own 404 for a path no fake serves)."""
        return self._hits


@pytest.fixture
def both(loop_thread: LoopThread) -> Iterator[Both]:
    b = Both(loop_thread)
    yield b
    b.server.stop()


@pytest.fixture
def reliable_proxy(
    loop_thread: LoopThread, both: Both, tmp_path: Path
) -> Iterator[Callable[..., ProxyServer]]:
    started: list[ProxyServer] = []

    def start(**extra: Any) -> ProxyServer:
        config = make_config(
            both.url, tmp_path, policies=POLICIES, routes=ROUTES, extra=extra or None
        )
        proxy = ProxyServer(loop_thread, config)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
