"""Fixtures of the reliability suite: one fake upstream serving chat and Responses."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

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
]
POLICIES = {"last2": {"strategy": "trim", "max_turns": 2}}


class Both:
    """A chat fake and a Responses fake behind one port."""

    def __init__(self, loop: LoopThread) -> None:
        self.chat = FakeUpstream()
        self.responses = FakeResponses()
        app = self.chat.app()
        for route in self.responses.app().router.routes():
            app.router.add_route(route.method, route.resource.canonical, route.handler)  # type: ignore[union-attr]
        self.server = AiohttpServer(loop, app)

    @property
    def url(self) -> str:
        return self.server.url


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
