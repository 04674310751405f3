"""Recall through the proxy with the openai SDK: evicted turns come back when asked about."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai

from policies.recall import BLOCK_OPEN
from tests.chat.test_trim_e2e import client
from tests.harness import query

ROUTE = [{"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "support"}]
POLICY = {
    "support": {
        "strategy": "trim",
        "max_tokens": 1200,
        "low_water": 0.6,
        "recall": {"max_tokens": 300, "neighbors": 1},
    }
}
ORDER_TURN = "My order number is 88412-KX and please deliver it to 17 Quai des Celestins, Lyon."
QUESTION = "Remind me, what delivery address did I give for the order?"


def user_turn(t: int) -> str:
    if t == 3:
        return ORDER_TURN
    return f"Turn {t}: tell me something about topic number {t} in a few words, please."


def block_index(messages: list[dict[str, Any]]) -> int | None:
    for i, m in enumerate(messages):
        if isinstance(m.get("content"), str) and BLOCK_OPEN in m["content"]:
            return i
    return None


def stable_prefix(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What precedes the recall block, or the newest user message when there is none."""
    at = block_index(messages)
    return messages[: len(messages) - 1 if at is None else at]


def test_turn_3_comes_back_at_turn_61_after_the_policy_dropped_it(fake, start_proxy, tmp_path):
    upstream, _ = fake
    proxy = start_proxy(policies=POLICY, routes=ROUTE)
    c = client(proxy, "recall-60")
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a shop assistant."}]
    raw = None
    for t in range(1, 62):
        history.append({"role": "user", "content": QUESTION if t == 61 else user_turn(t)})
        raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        proxy.drain()
    assert raw is not None
    last, previous = upstream.received[-1].json["messages"], upstream.received[-2].json["messages"]
    # Turn 3 was dropped by the budget...
    assert not any(m.get("content") == ORDER_TURN for m in last)
    # ...and came back, quoted in the recall block right before the question.
    at = block_index(last)
    assert at is not None and at == len(last) - 2
    assert last[-1] == {"role": "user", "content": QUESTION}
    quoted = [json.loads(line) for line in last[at]["content"].splitlines() if line.startswith("{")]
    assert {"position": 6, "role": "user", "text": ORDER_TURN} in quoted
    # The prefix before the block is the previous request's, byte for byte, plus its turn.
    prefix = stable_prefix(previous)
    assert json.dumps(last[: len(prefix)]) == json.dumps(prefix)
    assert last[:at] == [*prefix, *history[-4:-2]]
    recall = recall_row(tmp_path, raw.headers, budget=1200, needle="%88412-KX%")
    assert [5, 6] in recall["spans"]


def recall_row(tmp_path: Path, h: Any, *, budget: int, needle: str) -> dict[str, Any]:
    """The headers say recall happened within its 300 tokens and the policy's budget; the
    request row agrees and names the stored item matching ``needle`` (LIKE) among its hits."""
    assert h["x-context-recall"] == "recalled"
    assert int(h["x-context-recalled"]) >= 1
    tokens = int(h["x-context-recall-tokens"])
    assert 0 < tokens <= 300
    assert int(h["x-context-tokens-after"]) <= budget
    row = query(
        tmp_path / "ctxproxy.db",
        "SELECT detail_json FROM requests WHERE id = ?",
        h["x-ctxproxy-request-id"],
    )[0]
    recall: dict[str, Any] = json.loads(row["detail_json"])["recall"]
    assert recall["status"] == "recalled" and recall["tokens"] == tokens
    item = query(tmp_path / "ctxproxy.db", "SELECT id FROM items WHERE message_json LIKE ?", needle)
    assert any(hit[1] == item[0]["id"] and hit[2] > 0 for hit in recall["hits"])
    return recall


def test_a_policy_without_recall_gets_no_recall_headers(fake, start_proxy):
    upstream, _ = fake
    policies = {"support": {"strategy": "trim", "max_turns": 2}}
    proxy = start_proxy(policies=policies, routes=ROUTE)
    messages = [{"role": "user", "content": f"m {i}"} for i in range(5)]
    raw = client(proxy, "plain").chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages
    )
    assert "x-context-recall" not in raw.headers
    assert block_index(upstream.received[-1].json["messages"]) is None


def test_an_index_error_serves_the_request_without_recall(fake, start_proxy, tmp_path):
    upstream, _ = fake
    proxy = start_proxy(policies=POLICY, routes=ROUTE)
    c = client(proxy, "broken")
    history: list[dict[str, Any]] = []
    for t in range(1, 40):
        history.append({"role": "user", "content": user_turn(t)})
        reply = c.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    proxy.drain()

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("index is gone")

    proxy.runtime.recall._index.search = broken
    history.append({"role": "user", "content": QUESTION})
    raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
    assert raw.http_response.status_code == 200
    assert raw.headers["x-context-recall"] == "error"
    assert "x-context-recalled" not in raw.headers
    assert block_index(upstream.received[-1].json["messages"]) is None
    metrics = raw.http_response  # the counter is in /metrics
    del metrics
    text = openai.OpenAI(base_url=f"{proxy.url}", api_key="x").get("/metrics", cast_to=str)
    assert 'ctxproxy_recall_total{policy="support",outcome="error"} 1' in text


def test_preview_and_the_admin_view_show_what_recall_brought_back(
    fake, start_proxy, tmp_path, monkeypatch
):
    monkeypatch.setenv("CTX_RECALL_ADMIN", "adm-key")
    admin = {"admin": {"api_key": "os.environ/CTX_RECALL_ADMIN"}}
    proxy = start_proxy(policies=POLICY, routes=ROUTE, extra=admin)
    c = client(proxy, "shown")
    history: list[dict[str, Any]] = []
    for t in range(1, 40):
        history.append({"role": "user", "content": user_turn(t)})
        reply = c.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    proxy.drain()
    body = {"model": "gpt-4o", "messages": [*history, {"role": "user", "content": QUESTION}]}
    preview = c.post("/context/preview", body=body, cast_to=httpx.Response)
    shown = preview.json()
    assert shown["recall"]["status"] == "recalled"
    assert preview.headers["x-context-recall"] == "recalled"
    assert any(BLOCK_OPEN in str(m.get("content")) for m in shown["messages"])
    sent = c.chat.completions.with_raw_response.create(**body)
    proxy.drain()
    row = httpx.get(
        f"{proxy.url}/admin/requests/{sent.headers['x-ctxproxy-request-id']}",
        headers={"Authorization": "Bearer adm-key"},
    ).json()
    assert row["recall"]["status"] == "recalled"
    assert row["recall"]["spans"] == shown["recall"]["spans"]
