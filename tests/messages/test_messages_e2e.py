"""POST /v1/messages end to end: the official ``anthropic`` SDK through the proxy to a
fake Anthropic upstream that checks every body and event against the SDK's own types.

What reached the upstream, what reached the client and what was stored are asserted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.anthropic import FakeAnthropic, Reply, ToolUse
from tests.harness import ProxyServer, query
from tests.messages.sdk import sdk_client

MODEL = "claude-fake-1"
SESSION = {"X-Session-Id": "s-msg"}


@pytest.fixture
def proxy_for(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> Callable[..., ProxyServer]:
    def start(**kwargs: Any) -> ProxyServer:
        return start_messages({"base_url": f"{claude.url}/v1", "api": "anthropic"}, **kwargs)

    return start


def test_a_plain_message_reaches_the_upstream_as_sent_and_the_answer_the_client(
    proxy_for: Callable[..., ProxyServer], claude: FakeAnthropic, tmp_path: Path
) -> None:
    proxy = proxy_for()
    answer = sdk_client(proxy).messages.create(
        model=MODEL,
        max_tokens=64,
        system="You are terse.",
        messages=[{"role": "user", "content": "Hello?"}],
    )
    assert answer.content[0].type == "text"
    assert answer.content[0].text == "Hello from the fake Anthropic."
    sent = claude.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.json == {
        "model": MODEL,
        "max_tokens": 64,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Hello?"}],
    }
    # The client's own key (as this SDK sends it) and Anthropic's version header go on.
    assert sent.headers["authorization"] == "Bearer sk-ant-client"
    assert sent.headers["anthropic-version"]
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    rows = query(db, "SELECT route, status, model, upstream_prompt_tokens FROM requests")
    assert [tuple(r) for r in rows] == [("routes[0]", 200, MODEL, answer.usage.input_tokens)]
    stored = [
        json.loads(r["message"])
        for r in query(db, "SELECT message_json AS message FROM items ORDER BY id")
    ]
    assert [m["role"] for m in stored] == ["system", "user", "assistant"]
    assert stored[-1]["content"] == [{"type": "text", "text": "Hello from the fake Anthropic."}]


def test_a_stream_is_relayed_byte_for_byte_and_its_reply_stored(
    proxy_for: Callable[..., ProxyServer], claude: FakeAnthropic, tmp_path: Path
) -> None:
    proxy = proxy_for()
    claude.script(Reply(text="One two three."))
    body = {
        "model": MODEL,
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "Count."}],
    }
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", **SESSION}
    url = f"{proxy.url}/v1/messages?beta=true"  # as Claude Code asks
    with httpx.stream("POST", url, json=body, headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        received = b"".join(r.iter_raw())
    assert received == bytes(claude.last_stream)
    assert claude.requests[0].headers["x-api-key"] == "k"
    assert claude.requests[0].query == "beta=true"
    assert claude.requests[0].headers["anthropic-version"] == "2023-06-01"
    # And the SDK reads the same stream into its message.
    claude.script(Reply(text="One two three."))
    with sdk_client(proxy).messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Count."}]
    ) as stream:
        assert stream.get_final_text() == "One two three."
    proxy.drain()
    stored = [
        json.loads(r["message"])
        for r in query(
            tmp_path / "ctxproxy.db", "SELECT message_json AS message FROM items ORDER BY id"
        )
    ]
    assert stored[-1]["role"] == "assistant"
    assert stored[-1]["anthropic_blocks"] == [{"type": "text", "text": "One two three."}]


def test_a_tool_round_trip_goes_through_as_the_sdk_sent_it(
    proxy_for: Callable[..., ProxyServer], claude: FakeAnthropic, tmp_path: Path
) -> None:
    proxy = proxy_for()
    tools: list[Any] = [
        {
            "name": "get_weather",
            "description": "Weather of a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    claude.script(Reply.tool("get_weather", {"city": "Paris"}, text="Let me look."))
    sdk = sdk_client(proxy)
    history: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = sdk.messages.create(model=MODEL, max_tokens=64, tools=tools, messages=history)
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    assert call.input == {"city": "Paris"}
    history += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21C"}],
        },
    ]
    second = sdk.messages.create(model=MODEL, max_tokens=64, tools=tools, messages=history)
    assert second.stop_reason == "end_turn"
    sent = claude.requests[1].json["messages"]
    assert sent[1]["content"][0] == {"type": "text", "text": "Let me look."}
    # The proxy's one breakpoint: the end of the stable prefix (the client placed none).
    assert sent[1]["content"][1] == {
        "type": "tool_use",
        "id": "toolu_fake_01",
        "name": "get_weather",
        "input": {"city": "Paris"},
        "cache_control": {"type": "ephemeral"},
    }
    assert sent[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_fake_01", "content": "Sunny, 21C"}
    ]
    # The session is one chain: the answer the SDK sent back is the one stored.
    proxy.drain()
    rows = query(tmp_path / "ctxproxy.db", "SELECT role FROM items ORDER BY id")
    assert [r["role"] for r in rows] == ["user", "assistant", "tool", "assistant"]


def test_a_streamed_tool_call_reaches_the_sdk_whole(
    proxy_for: Callable[..., ProxyServer], claude: FakeAnthropic, tmp_path: Path
) -> None:
    proxy = proxy_for()
    claude.script(Reply(text="", tool_use=ToolUse("lookup", {"q": "a long query string"})))
    with sdk_client(proxy).messages.stream(
        model=MODEL,
        max_tokens=64,
        tools=[{"name": "lookup", "input_schema": {"type": "object"}}],
        messages=[{"role": "user", "content": "Find it."}],
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "tool_use"
    assert final.content[0].input == {"q": "a long query string"}
    proxy.drain()
    stored = json.loads(
        query(
            tmp_path / "ctxproxy.db",
            "SELECT message_json AS message FROM items ORDER BY id DESC LIMIT 1",
        )[0]["message"]
    )
    assert stored["tool_calls"][0]["function"] == {
        "name": "lookup",
        "arguments": '{"q":"a long query string"}',
    }
