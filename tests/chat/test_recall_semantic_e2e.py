"""Semantic recall through the proxy with the openai SDK and the real wordllama model.

A question that shares no word with the turn that answers it ("Where should
the parcel be shipped?" against "... please deliver it to 17 Quai des
Celestins"): lexical search cannot find it; with ``embeddings: wordllama``
the turn comes back, and its vectors were stored in the background.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.context.recall_query import query_terms
from tests.chat.test_recall_e2e import ORDER_TURN, ROUTE, block_index, user_turn
from tests.chat.test_trim_e2e import client
from tests.harness import query

PARAPHRASE = "Where should the parcel be shipped?"


def policy(embeddings: str) -> dict[str, Any]:
    recall = {"max_tokens": 300, "neighbors": 0, "embeddings": embeddings}
    return {"support": {"strategy": "trim", "max_tokens": 900, "low_water": 0.6, "recall": recall}}


def test_the_paraphrase_shares_no_word_with_the_turn_it_needs():
    assert set(query_terms(PARAPHRASE)) & set(query_terms(ORDER_TURN)) == set()


@pytest.mark.parametrize("embeddings", ["wordllama", "none"])
def test_a_paraphrased_question_recalls_its_turn_only_with_embeddings(
    fake, start_proxy, tmp_path, embeddings
):
    upstream, _ = fake
    proxy = start_proxy(policies=policy(embeddings), routes=ROUTE)
    c = client(proxy, f"semantic-{embeddings}")
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a shop assistant."}]
    raw = None
    for t in range(1, 42):
        history.append({"role": "user", "content": PARAPHRASE if t == 41 else user_turn(t)})
        raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        proxy.drain()
    assert raw is not None
    last = upstream.received[-1].json["messages"]
    # Dropped by the budget in both runs.
    assert not any(m.get("content") == ORDER_TURN for m in last)
    at = block_index(last)
    quoted = (
        []
        if at is None
        else [json.loads(x) for x in last[at]["content"].splitlines() if x.startswith("{")]
    )
    recalled = any(q.get("text") == ORDER_TURN for q in quoted)
    row = query(
        tmp_path / "ctxproxy.db",
        "SELECT detail_json FROM requests WHERE id = ?",
        raw.headers["x-ctxproxy-request-id"],
    )[0]
    detail = json.loads(row["detail_json"])["recall"]
    vectors = query(tmp_path / "ctxproxy.db", "SELECT count(*) AS n FROM item_vectors")[0]["n"]
    if embeddings == "wordllama":
        assert recalled and raw.headers["x-context-recall"] == "recalled"
        assert detail["semantic"] == "used" and detail["vectors"] >= 80
        # Every stored message with words got its vector in the background (the last reply too).
        assert vectors == len(history) - 1
    else:
        assert not recalled
        assert "semantic" not in detail and vectors == 0
