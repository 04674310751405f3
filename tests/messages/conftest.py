"""Fixtures of the /v1/messages tests: a strict fake Anthropic upstream, and a proxy whose
one route sends /v1/messages to a given upstream under an optional policy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.config.loader import parse_config
from tests.fakes.anthropic import FakeAnthropic
from tests.harness import LoopThread, ProxyServer


@pytest.fixture
def claude(loop_thread: LoopThread) -> Iterator[FakeAnthropic]:
    """A fake Anthropic upstream that checks bodies and events against the SDK's types,
    and reports the request's own size as its input tokens."""
    fake = FakeAnthropic(strict=True, count_input=True)
    loop_thread.run(fake.start())
    yield fake
    loop_thread.run(fake.stop())
    assert fake.problems == [], "\n".join(fake.problems)


@pytest.fixture
def start_messages(loop_thread: LoopThread, tmp_path: Path) -> Iterator[Callable[..., ProxyServer]]:
    """``start(upstream, policy=None, route=None, **sections)``: a proxy routing
    /v1/messages to ``upstream`` (``route``: more of the route's fields)."""
    started: list[ProxyServer] = []

    def start(
        upstream: dict[str, Any],
        policy: dict[str, Any] | None = None,
        route: dict[str, Any] | None = None,
        **sections: Any,
    ) -> ProxyServer:
        route = {"match": {"path": "/v1/messages"}, "upstream": "up", **(route or {})}
        if policy is not None:
            route["policy"] = "p"
        data: dict[str, Any] = {
            "store": {"path": str(tmp_path / "ctxproxy.db")},
            "upstreams": {"up": {"timeout_s": 5, **upstream}},
            "routes": [route],
            "policies": {"p": policy} if policy is not None else {},
            **sections,
        }
        proxy = ProxyServer(loop_thread, parse_config(data))
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()
