"""A compaction whose range does not fit the summarizer's window is summarized in chunks.

Over real HTTP, as tests/responses/test_compaction.py: the route's compaction
summarizer says its window (``context_window``); a long history is then
summarized in several calls, oldest first, each within the window and
extending the partial summary the previous call wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tiktoken

from proxy.context.compaction_item import decode
from tests.fakes.responses import FakeResponses
from tests.fakes.upstream import FakeUpstream
from tests.harness import AiohttpServer, LoopThread, ProxyServer, query
from tests.responses.test_compaction import (
    ADMIN_KEY,
    TRIGGER,
    assistant,
    client,
    proxy_config,
    user,
)

WINDOW = 1500


@pytest.fixture(autouse=True)
def admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_COMPACTION_ADMIN_KEY", ADMIN_KEY)


def long_history(turns: int = 12) -> list[dict[str, Any]]:
    """A long session: each message names its turn, among ~100 tokens of notes."""
    notes = " ".join(f"note{n} checked" for n in range(40))
    out: list[dict[str, Any]] = []
    for n in range(turns):
        out.append(user(f"Step {n}: look at module m{n}. {notes}"))
        out.append(assistant(f"Module m{n} is fine. {notes}"))
    return out


def tokens(messages: list[dict[str, Any]]) -> int:
    """About what the summarizer model reads (o200k, 4 tokens a message)."""
    encoding = tiktoken.get_encoding("o200k_base")
    return sum(len(encoding.encode(m["content"])) + 4 for m in messages)


def started(
    loop_thread: LoopThread,
    responses: AiohttpServer,
    summarizer: AiohttpServer,
    tmp_path: Path,
    keys: dict[str, Any],
) -> ProxyServer:
    config = proxy_config(responses, summarizer, tmp_path, summarizer_keys=keys)
    return ProxyServer(loop_thread, config)


def test_a_range_past_the_summarizers_window_is_summarized_in_chunks_each_extending_the_last(
    loop_thread: LoopThread,
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    fake: tuple[FakeUpstream, AiohttpServer],
    tmp_path: Path,
):
    keys = {"context_window": WINDOW, "max_tokens": 100}
    proxy = started(loop_thread, responses_upstream[1], fake[1], tmp_path, keys)
    try:
        history = long_history()
        answer = client(proxy).responses.with_raw_response.create(
            model="m", input=[*history, TRIGGER]
        )
        proxy.drain()
    finally:
        proxy.stop()
    assert answer.headers["x-context-compaction"] == "created"
    calls = [r.json["messages"] for r in fake[0].summarizer_requests]
    assert 2 <= len(calls) <= 8
    # Each call fits the window with its answer; every turn is in exactly one call, in order.
    assert all(tokens(messages) + 100 <= WINDOW for messages in calls)
    asked = [messages[-1]["content"] for messages in calls]
    steps = [[n for n in range(12) if f"Step {n}:" in text] for text in asked]
    assert [n for run in steps for n in run] == list(range(12))
    # Each call after the first extends the partial summary the previous one wrote.
    assert "The summary so far:" not in asked[0]
    for n, text in enumerate(asked[1:], start=1):
        assert f"<summary>\n## Goal and context\n- fake summary {n}\n</summary>" in text
    # The item carries the last call's text: the whole range's summary.
    item = answer.parse().output[0].model_dump()
    assert decode(item["encrypted_content"]).summary.endswith(f"fake summary {len(calls)}")
    (row,) = query(tmp_path / "ctxproxy.db", "SELECT usage_json FROM summaries")
    assert json.loads(row["usage_json"])["calls"] == len(calls)


def test_a_range_needing_too_many_calls_gets_the_offline_summary(
    loop_thread: LoopThread,
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    fake: tuple[FakeUpstream, AiohttpServer],
    tmp_path: Path,
):
    # Room for about one message a call: more calls than a compaction may take.
    keys = {"context_window": 900, "max_tokens": 50}
    proxy = started(loop_thread, responses_upstream[1], fake[1], tmp_path, keys)
    try:
        answer = client(proxy).responses.with_raw_response.create(
            model="m", input=[*long_history(), TRIGGER]
        )
        proxy.drain()
    finally:
        proxy.stop()
    assert answer.headers["x-context-compaction"] == "fallback"
    assert answer.headers["x-context-compaction-fallback"] == "summarizer_too_long"
    assert fake[0].summarizer_requests == []
    item = answer.parse().output[0].model_dump()
    assert decode(item["encrypted_content"]).model == "ctxproxy/extractive"
