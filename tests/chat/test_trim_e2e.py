"""Trimming through the proxy: what reaches the upstream, what the client and the store see."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.harness import query
from tests.openapi import validate

TRIM_ROUTE = [{"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "last3"}]


def ten_turns_with_tools() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a travel agent."}]
    for t in range(10):
        messages.append({"role": "user", "content": f"question {t}"})
        if t % 2 == 0:
            call_id = f"call_{t}"
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "lookup", "arguments": json.dumps({"t": t})},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": call_id, "content": f"result {t}"})
        messages.append({"role": "assistant", "content": f"answer {t}"})
    messages.append({"role": "user", "content": "and now?"})
    return messages


def client(proxy: Any, session: str = "trim") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-t",
        max_retries=0,
        default_headers={"X-Session-Id": session},
    )


def assert_tool_pairs_intact(messages: list[dict[str, Any]]) -> None:
    for i, m in enumerate(messages):
        if m.get("tool_calls"):
            ids = {c["id"] for c in m["tool_calls"]}
            following = {
                r["tool_call_id"] for r in messages[i + 1 : i + 1 + len(ids)] if r["role"] == "tool"
            }
            assert following == ids
        if m["role"] == "tool":
            assert any(
                c["id"] == m["tool_call_id"]
                for prev in messages[:i]
                for c in prev.get("tool_calls") or []
            )


def test_max_turns_forwards_system_plus_exactly_the_last_three_turns(fake, start_proxy, tmp_path):
    upstream, _ = fake
    proxy = start_proxy(policies={"last3": {"strategy": "trim", "max_turns": 3}}, routes=TRIM_ROUTE)
    messages = ten_turns_with_tools()
    raw = client(proxy).chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
    sent = upstream.received[-1].json["messages"]
    # Turns 8 and 9 (8 has a tool pair) and the newest question.
    start = next(i for i, m in enumerate(messages) if m.get("content") == "question 8")
    assert sent == [messages[0], *messages[start:]]
    assert_tool_pairs_intact(sent)
    h = raw.headers
    assert h["x-context-policy"] == "last3"
    assert h["x-context-trim-reason"] == "max_turns"
    assert int(h["x-context-turns-dropped"]) == 8
    assert int(h["x-context-messages-dropped"]) == len(messages) - len(sent)
    assert int(h["x-context-tokens-after"]) < int(h["x-context-tokens-before"])
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    row = query(db, "SELECT * FROM requests")[0]
    assert row["policy"] == "last3" and row["reason"] == "max_turns"
    assert row["messages_before"] == len(messages) and row["messages_after"] == len(sent)
    assert row["turns_dropped"] == 8
    # Dropped positions as spans: the row does not grow with the session.
    assert json.loads(row["dropped_indexes"]) == [[1, start]]
    assert json.loads(row["dropped_item_ids"]) == []


def test_token_budget_keeps_newest_turns_that_fit(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(
        policies={"fit": {"strategy": "trim", "max_tokens": 300}},
        routes=[
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "fit"}
        ],
    )
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for t in range(30):
        messages += [
            {"role": "user", "content": f"turn {t} " + "word " * 20},
            {"role": "assistant", "content": f"reply {t} " + "word " * 20},
        ]
    raw = client(proxy).chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
    sent = upstream.received[-1].json["messages"]
    assert sent[0] == messages[0]
    assert sent[-2:] == messages[-2:]
    assert 3 < len(sent) < len(messages)
    assert int(raw.headers["x-context-tokens-after"]) <= 300
    assert raw.headers["x-context-trim-reason"] == "max_tokens"


def test_newest_turn_over_budget_is_a_400_context_length_exceeded(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(
        policies={"tiny": {"strategy": "trim", "max_tokens": 50}},
        routes=[
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "tiny"}
        ],
    )
    with pytest.raises(openai.BadRequestError) as info:
        client(proxy).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "word " * 200}]
        )
    body = info.value.response.json()
    validate("ErrorResponse", body)
    assert body["error"]["code"] == "context_length_exceeded"
    numbers = [int(s) for s in body["error"]["message"].replace(",", " ").split() if s.isdigit()]
    assert 50 in numbers and any(n > 50 for n in numbers)
    assert upstream.received == []


def test_request_max_tokens_is_reserved_from_the_context_window_budget(fake, start_proxy):
    upstream, _ = fake
    # gpt-4o's window is 128,000 tokens in litellm's model map: 0.003 of it is 384.
    proxy = start_proxy(
        policies={"share": {"strategy": "trim", "context_fraction": 0.003}},
        routes=[
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "share"}
        ],
    )
    messages: list[dict[str, Any]] = []
    for t in range(20):
        messages += [
            {"role": "user", "content": f"turn {t} " + "word " * 20},
            {"role": "assistant", "content": f"reply {t}"},
        ]
    messages.append({"role": "user", "content": "last"})
    c = client(proxy)
    wide = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
    narrow = c.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, max_completion_tokens=200
    )
    assert 200 < int(wide.headers["x-context-tokens-after"]) <= 384
    assert int(narrow.headers["x-context-tokens-after"]) <= 384 - 200
    assert len(upstream.received[-1].json["messages"]) < len(upstream.received[-2].json["messages"])


def test_client_max_tokens_does_not_shrink_an_absolute_budget(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(
        policies={"fit": {"strategy": "trim", "max_tokens": 400}},
        routes=[
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "fit"}
        ],
    )
    raw = client(proxy).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=4096
    )
    assert raw.http_response.status_code == 200
    assert len(upstream.received) == 1


def test_orphan_tool_result_from_the_client_is_repaired_and_recorded(fake, start_proxy, tmp_path):
    upstream, _ = fake
    proxy = start_proxy(policies={"last3": {"strategy": "trim", "max_turns": 3}}, routes=TRIM_ROUTE)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "ghost", "content": "orphan"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]
    raw = client(proxy, "orphans").chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages
    )
    sent = upstream.received[-1].json["messages"]
    assert {"role": "tool", "tool_call_id": "ghost", "content": "orphan"} not in sent
    assert raw.headers["x-context-messages-dropped"] == "1"
    proxy.drain()
    row = query(tmp_path / "ctxproxy.db", "SELECT detail_json FROM requests")[0]
    assert json.loads(row["detail_json"])["repaired"] == [1]
