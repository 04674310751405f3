"""Shared fixtures. Nothing here reaches beyond 127.0.0.1."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Before anything imports litellm or tiktoken: no network, bundled encodings.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
_spec = importlib.util.find_spec("litellm")
assert _spec is not None and _spec.origin is not None
os.environ["TIKTOKEN_CACHE_DIR"] = str(
    Path(_spec.origin).parent / "litellm_core_utils" / "tokenizers"
)
# Keep any accidental real-provider call pointed at nothing.
os.environ.pop("OPENAI_API_KEY", None)

from tests.fakes.responses import FakeResponses  # noqa: E402
from tests.fakes.upstream import FakeUpstream  # noqa: E402
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config  # noqa: E402

# The real llama.cpp server (llama-cpp-python with Gemma 3 270M), started once when asked for.
from tests.llama_server import llama_server, startup_line  # noqa: E402, F401

# The store contract tests' fixtures: `store` (every backend) and `clock`; the
# PostgreSQL schemas of the run are dropped at its end.
from tests.stores import clock, postgres_schemas, store  # noqa: E402, F401


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.stop()


@pytest.fixture
def fake(loop_thread: LoopThread) -> Iterator[tuple[FakeUpstream, AiohttpServer]]:
    upstream = FakeUpstream()
    server = AiohttpServer(loop_thread, upstream.app())
    yield upstream, server
    server.stop()


@pytest.fixture
def responses_upstream(loop_thread: LoopThread) -> Iterator[tuple[FakeResponses, AiohttpServer]]:
    """A recording fake upstream that serves /v1/responses."""
    upstream = FakeResponses()
    server = AiohttpServer(loop_thread, upstream.app())
    yield upstream, server
    server.stop()


@pytest.fixture
def start_proxy(
    loop_thread: LoopThread,
    fake: tuple[FakeUpstream, AiohttpServer],
    tmp_path: Path,
) -> Iterator[Callable[..., ProxyServer]]:
    started: list[ProxyServer] = []

    def start(**kwargs: Any) -> ProxyServer:
        config = kwargs.pop("config", None) or make_config(fake[1].url, tmp_path, **kwargs)
        proxy = ProxyServer(loop_thread, config)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name each test skipped for want of ../shared/data (``-rs`` gives only the reason)."""
    from tests.shared_data import REASON

    skipped = [
        r.nodeid
        for r in terminalreporter.stats.get("skipped", [])
        if isinstance(r.longrepr, tuple) and REASON in str(r.longrepr[2])
    ]
    if skipped:
        terminalreporter.section(f"{len(skipped)} tests skipped: ../shared/data is absent")
        for nodeid in skipped:
            terminalreporter.line(nodeid)
    started = startup_line()
    if started is not None:
        terminalreporter.section("real inference server")
        terminalreporter.line(started)
