"""Semantic recall on /v1/responses: stored input and output items are embedded too.

A chain of responses through the proxy with the openai SDK and the real
wordllama model; the last question shares no word with the turn that
answers it (tests/chat/test_recall_semantic_e2e.py has the chat case). With
``embeddings: wordllama`` that turn comes back, and the items of every
response (what the client sent and what the upstream answered, the function
call and its output included) got their vectors in the background; with
``embeddings: none`` neither happens.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chat.test_recall_e2e import ORDER_TURN
from tests.chat.test_recall_semantic_e2e import PARAPHRASE
from tests.fakes.responses import FakeResponses
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query
from tests.responses.test_e2e import WEATHER
from tests.responses.test_recall import POLICIES, block_at, chain, paired, quoted


@pytest.fixture(params=["wordllama", "none"])
def semantic_proxy(
    request: pytest.FixtureRequest,
    loop_thread: LoopThread,
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    tmp_path: Path,
) -> Iterator[tuple[ProxyServer, str]]:
    support: dict[str, Any] = POLICIES["support"]
    recall = {**support["recall"], "neighbors": 0, "embeddings": request.param}
    policies = {"support": {**support, "recall": recall}}
    routes = [{"match": {"path": "/v1/responses"}, "upstream": "default", "policy": "support"}]
    config = make_config(responses_upstream[1].url, tmp_path, policies=policies, routes=routes)
    server = ProxyServer(loop_thread, config)
    yield server, request.param
    server.stop()


def test_response_items_are_embedded_and_a_paraphrase_recalls_its_turn_only_with_embeddings(
    semantic_proxy: tuple[ProxyServer, str],
    responses_upstream: tuple[FakeResponses, AiohttpServer],
    tmp_path: Path,
) -> None:
    proxy, embeddings = semantic_proxy
    fake, _ = responses_upstream
    c, previous = chain(proxy, fake, 40, lambda t: None)
    raw = c.responses.with_raw_response.create(
        model="gpt-4o", input=PARAPHRASE, tools=[WEATHER], previous_response_id=previous
    )
    proxy.drain()
    last = fake.last["input"]
    assert not any(i.get("content") == ORDER_TURN for i in last)  # evicted in both runs
    at = block_at(last)
    recalled = at is not None and any(q.get("text") == ORDER_TURN for q in quoted(last[at]))
    assert paired(last)

    db = tmp_path / "ctxproxy.db"
    by_role = {
        r["role"]: r["n"]
        for r in query(
            db,
            "SELECT i.role AS role, count(*) AS n FROM item_vectors v"
            " JOIN items i ON i.id = v.item_id GROUP BY i.role",
        )
    }
    types = {
        r["t"]
        for r in query(
            db,
            "SELECT json_extract(i.message_json, '$.type') AS t FROM item_vectors v"
            " JOIN items i ON i.id = v.item_id",
        )
    }
    if embeddings == "wordllama":
        assert recalled and raw.headers["x-context-recall"] == "recalled"
        # Inputs and outputs alike; the tool call and its output are items too.
        assert by_role.get("user", 0) >= 40 and by_role.get("assistant", 0) >= 40
        assert {"function_call", "function_call_output"} <= types
    else:
        assert not recalled
        assert by_role == {}
