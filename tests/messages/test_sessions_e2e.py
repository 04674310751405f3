"""Sessions on the Messages door: server-held history replayed as the client's own blocks,
and the preview of what a Messages request would forward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.fakes.anthropic import FakeAnthropic, Reply, ToolUse
from tests.harness import ProxyServer
from tests.messages.sdk import sdk_client

MODEL = "claude-fake-1"


def test_server_held_history_is_replayed_with_thinking_and_tool_blocks_as_they_were(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"}, route={"history": "server"}
    )
    client = sdk_client(proxy, session="s-server")
    claude.script(
        Reply(
            text="Reading.",
            thinking=("I should read a.txt.", "sig-1"),
            tool_use=ToolUse("read", {"path": "a.txt"}),
        )
    )
    first = client.messages.create(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Open a.txt"}]
    )
    call = first.content[-1]
    assert call.type == "tool_use"
    # Only the new message: the proxy holds the rest.
    result: Any = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "hello"}],
    }
    client.messages.create(model=MODEL, max_tokens=64, messages=[result])
    sent = claude.requests[1].json["messages"]
    assert sent[0] == {"role": "user", "content": "Open a.txt"}
    blocks = sent[1]["content"]
    assert blocks[0] == {
        "type": "thinking",
        "thinking": "I should read a.txt.",
        "signature": "sig-1",
    }
    assert blocks[1] == {"type": "text", "text": "Reading."}
    assert blocks[2]["type"] == "tool_use" and blocks[2]["input"] == {"path": "a.txt"}
    assert sent[2] == result


def test_the_preview_shows_the_content_blocks_a_messages_request_would_forward(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"}, {"strategy": "trim", "max_turns": 1}
    )
    messages: list[Any] = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [{"type": "text", "text": "one"}]},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
    ]
    body = {"model": MODEL, "max_tokens": 8, "system": "sys", "messages": messages}
    headers = {"anthropic-version": "2023-06-01", "x-api-key": "k", "X-Session-Id": "s-prev"}
    got = httpx.post(f"{proxy.url}/v1/context/preview", json=body, headers=headers)
    assert got.status_code == 200
    preview = got.json()
    assert preview["endpoint"] == "/v1/messages"
    assert preview["system"] == "sys"
    assert preview["messages"] == messages[-1:]
    assert preview["decision"]["turns_dropped"] == 1
    assert claude.requests == []  # nothing was sent


def test_a_summarize_policy_summarizes_through_the_anthropic_upstream_into_the_system(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"},
        {"strategy": "summarize", "trigger": {"turns": 4}, "keep_last_turns": 2},
    )
    claude.script(Reply(text="## Goal\n- the user counts turns"), Reply(text="fine"))
    messages: list[Any] = []
    for i in range(6):
        messages += [
            {"role": "user", "content": f"turn {i}"},
            {"role": "assistant", "content": f"reply {i}"},
        ]
    messages.append({"role": "user", "content": "and now?"})
    raw = sdk_client(proxy, session="s-sum").messages.with_raw_response.create(
        model=MODEL, max_tokens=16, system="Be kind.", messages=messages
    )
    assert raw.parse().content[0].text == "fine"
    summarizer, forwarded = claude.requests
    # The summarizer's call is a Messages call on the same upstream, with the client's key.
    assert summarizer.json["messages"][0]["role"] == "user"
    assert "turn 0" in summarizer.json["messages"][0]["content"]
    assert summarizer.headers["authorization"] == "Bearer sk-ant-client"
    # The summary goes into the system, after the client's own; the newest turns verbatim.
    assert forwarded.json["system"].startswith("Be kind.\n\n")
    assert "the user counts turns" in forwarded.json["system"]
    assert forwarded.json["messages"][-1] == {"role": "user", "content": "and now?"}
    assert len(forwarded.json["messages"]) < len(messages)
    assert raw.headers["x-context-summary"] in ("created", "used")
