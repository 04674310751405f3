"""Responses: the upstream's usage.input_tokens_details on the row, the stable prefix of a
chain, and the session's prompt_cache_key."""

from __future__ import annotations

from pathlib import Path

import openai

from tests.fakes.responses import FakeResponses
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query


def test_responses_cache_figures_stable_prefix_and_prompt_cache_key(
    loop_thread: LoopThread,
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    tmp_path: Path,
) -> None:
    fake, server = responses_upstream
    routes = [{"match": {"path": "/v1/responses"}, "upstream": "default"}]
    proxy = ProxyServer(loop_thread, make_config(server.url, tmp_path, routes=routes))
    try:
        c = openai.OpenAI(
            base_url=f"{proxy.url}/v1",
            api_key="sk-r",
            default_headers={"X-Session-Id": "resp-cache"},
            max_retries=0,
        )
        first = c.responses.create(model="gpt-4o", input="hello")
        raw = c.responses.with_raw_response.create(
            model="gpt-4o", input="and again", previous_response_id=first.id
        )
        second = raw.parse()
        proxy.drain()
        rows = query(tmp_path / "ctxproxy.db", "SELECT * FROM requests ORDER BY created_at")
        assert [r["upstream_prompt_tokens"] for r in rows] == [
            first.usage.input_tokens,
            second.usage.input_tokens,
        ]
        assert [r["cached_tokens"] for r in rows] == [
            first.usage.input_tokens_details.cached_tokens,
            second.usage.input_tokens_details.cached_tokens,
        ]
        # The chain's replayed items are what the first request forwarded, then more.
        assert int(raw.headers["x-context-stable-prefix"]) == rows[1]["stable_prefix"] >= 1
        keys = {r.json.get("prompt_cache_key") for r in fake.received if r.json}
        assert len(keys) == 1 and next(iter(keys)).startswith("ctxproxy-")
    finally:
        proxy.stop()
