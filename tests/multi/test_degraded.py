"""Redis unreachable: `history: server` requests are refused with a 503, the rest is served."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.harness import query

ROUTES = [
    {"match": {"model": "server-*"}, "upstream": "default", "history": "server"},
    {"match": {"path": "/v1/chat/completions"}, "upstream": "default"},
]
# Nothing listens on port 1: Redis is "down" from the start.
DEAD = {"coordination": {"redis_url": "redis://127.0.0.1:1/0", "lock_lease": "2s"}}


def client(proxy: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-t",
        max_retries=0,
        default_headers={"X-Session-Id": "s-1"},
    )


def test_without_redis_server_history_gets_a_503_and_nothing_is_stored(fake, start_proxy) -> None:
    upstream, _ = fake
    proxy = start_proxy(routes=ROUTES, extra=DEAD)
    c = client(proxy)
    with pytest.raises(openai.InternalServerError) as info:
        c.chat.completions.create(model="server-a", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 503
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "coordination_unavailable"
    assert upstream.chat_requests == []  # refused before anything was sent
    # A client-history request is served as usual, and stored.
    reply = c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "echo: hi"
    proxy.drain()
    rows = query(proxy.config.store.path, "SELECT route, status FROM requests ORDER BY created_at")
    assert [r[1] for r in rows] == [503, 200], [tuple(r) for r in rows]
    items = query(proxy.config.store.path, "SELECT COUNT(*) FROM items")[0][0]
    assert items == 2  # only the served exchange: the refused one stored nothing
