"""POST /v1/messages to an OpenAI-compatible upstream: translated by litellm's Anthropic
adapter, the answer (whole or streamed) translated back; the official ``anthropic`` SDK
as the client, the existing fake OpenAI-compatible upstream behind."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest
from pydantic import TypeAdapter

from tests.fakes.upstream import FakeUpstream, Reply
from tests.harness import AiohttpServer, ProxyServer, query
from tests.messages.sdk import sdk_client

MODEL = "gpt-4o"


@pytest.fixture
def proxy_for(
    fake: tuple[FakeUpstream, AiohttpServer], start_messages: Callable[..., ProxyServer]
) -> Callable[..., ProxyServer]:
    def start(policy: dict[str, Any] | None = None) -> ProxyServer:
        return start_messages({"base_url": f"{fake[1].url}/v1"}, policy)

    return start


def test_a_message_is_translated_to_a_chat_completion_and_back(
    proxy_for: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer], tmp_path: Path
) -> None:
    upstream, _ = fake
    proxy = proxy_for()
    answer = sdk_client(proxy).messages.create(
        model=MODEL,
        max_tokens=50,
        system=[{"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": "Ping"}],
    )
    assert answer.type == "message"
    assert answer.model == MODEL
    assert answer.content[0].type == "text" and answer.content[0].text == "echo: Ping"
    sent = upstream.chat_requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.json["messages"] == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "Ping"},
    ]
    assert sent.json["max_tokens"] == 50
    assert sent.headers["Authorization"] == "Bearer sk-ant-client"
    proxy.drain()
    rows = query(tmp_path / "ctxproxy.db", "SELECT status, upstream_prompt_tokens FROM requests")
    assert len(rows) == 1 and rows[0]["status"] == 200
    # The upstream's usage, translated: what calibration and the row read.
    assert rows[0]["upstream_prompt_tokens"] == answer.usage.input_tokens > 0


def test_a_streamed_tool_call_is_translated_into_anthropic_events(
    proxy_for: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer], tmp_path: Path
) -> None:
    upstream, _ = fake
    upstream.replies.append(
        Reply(
            tool_calls=[
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                }
            ]
        )
    )
    proxy = proxy_for()
    sdk = sdk_client(proxy)
    tools: list[Any] = [
        {
            "name": "read_file",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
    ]
    history: list[Any] = [{"role": "user", "content": "Read a.txt"}]
    events = []
    with sdk.messages.stream(model=MODEL, max_tokens=50, tools=tools, messages=history) as s:
        for event in s:
            events.append(event)
        final = s.get_final_message()
    # Every event the SDK read is one of its own types, in Anthropic's order.
    adapter = TypeAdapter(anthropic.types.RawMessageStreamEvent)
    raw = [e for e in events if e.type.startswith(("message_", "content_block_"))]
    assert raw[0].type == "message_start" and raw[-1].type == "message_stop"
    for event in raw:
        adapter.validate_python(event.model_dump())
    call = final.content[-1]
    assert call.type == "tool_use" and call.name == "read_file"
    assert call.input == {"path": "a.txt"}
    assert final.stop_reason == "tool_use"
    # The result goes back, translated into a tool message after the call.
    history += [
        {"role": "assistant", "content": final.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "hello"}],
        },
    ]
    second = sdk.messages.create(model=MODEL, max_tokens=50, tools=tools, messages=history)
    assert second.content[0].type == "text"
    sent = upstream.chat_requests[1].json["messages"]
    assert sent[1]["tool_calls"][0]["id"] == "call_1"
    assert sent[2]["role"] == "tool" and sent[2]["tool_call_id"] == "call_1"
    assert "hello" in json.dumps(sent[2]["content"])
    proxy.drain()
    stored = [
        json.loads(r[0])
        for r in query(tmp_path / "ctxproxy.db", "SELECT message_json FROM items ORDER BY id")
    ]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
