"""``context_management.edits`` through /v1/messages: passed to an Anthropic upstream as
sent, carried out by the proxy for a translated one."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx

from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.upstream import FakeUpstream
from tests.harness import AiohttpServer, ProxyServer
from tests.messages.sdk import sdk_client
from tests.messages.test_policies_e2e import FILLER, tool_conversation

EDITS: dict[str, Any] = {
    "edits": [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 1000},
            "keep": {"type": "tool_uses", "value": 2},
            "exclude_tools": ["pinned"],
        },
        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
    ]
}


def test_an_anthropic_upstream_gets_the_edits_and_the_conversation_as_sent(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages({"base_url": f"{claude.url}/v1", "api": "anthropic"})
    history = tool_conversation(8, thinking=True)
    body = {"model": "claude-fake-1", "max_tokens": 16, "messages": history}
    headers = {
        "x-api-key": "k",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "context-management-2025-06-27",
    }
    got = httpx.post(
        f"{proxy.url}/v1/messages", json={**body, "context_management": EDITS}, headers=headers
    )
    assert got.status_code == 200
    sent = claude.requests[0]
    assert sent.json["context_management"] == EDITS
    assert sent.headers["anthropic-beta"] == "context-management-2025-06-27"
    assert FILLER in json.dumps(sent.json["messages"][2])  # the upstream clears, not the proxy


def test_a_translated_upstream_gets_old_tool_results_cleared_and_old_thinking_left_out(
    fake: tuple[FakeUpstream, AiohttpServer], start_messages: Callable[..., ProxyServer]
) -> None:
    upstream, server = fake
    proxy = start_messages({"base_url": f"{server.url}/v1"})
    history = tool_conversation(8, thinking=True)
    history[1]["content"][2]["name"] = "pinned"  # the first call: an excluded tool
    extra: Any = {"context_management": EDITS}
    raw = sdk_client(proxy).messages.with_raw_response.create(
        model="gpt-4o", max_tokens=16, messages=history, extra_body=extra
    )
    assert raw.parse().content[0].type == "text"
    # Shown as masking, the proxy's own: five results.
    assert raw.headers["x-context-tool-outputs-masked"] == "5"
    sent = upstream.chat_requests[0].json["messages"]
    results = [m for m in sent if m["role"] == "tool"]
    texts = [json.dumps(m["content"]) for m in results]
    # The excluded tool's result and the newest two are whole; the rest are cleared.
    whole = [FILLER in t for t in texts]
    assert whole == [True, False, False, False, False, False, True, True]
    assert all("tool output of" in t for t, w in zip(texts, whole, strict=True) if not w)
    # Every call still has its result right after it.
    for i, message in enumerate(sent):
        for call in message.get("tool_calls") or []:
            assert sent[i + 1]["tool_call_id"] == call["id"]
    assert "context_management" not in upstream.chat_requests[0].json
    # clear_thinking kept the newest thinking turn only (litellm passes it as thinking_blocks).
    thinking = [bool(m.get("thinking_blocks")) for m in sent if m["role"] == "assistant"]
    assert thinking == [False] * 7 + [True]


def test_a_malformed_edit_is_a_400_in_anthropics_shape(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages({"base_url": f"{claude.url}/v1", "api": "anthropic"})
    bad: Any = {"edits": [{"type": "clear_tool_uses_20250919", "keep": 3}]}
    try:
        sdk_client(proxy).messages.create(
            model="claude-fake-1",
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"context_management": bad},
        )
    except anthropic.BadRequestError as exc:
        assert "context_management.edits.0.keep" in exc.body["error"]["message"]  # type: ignore[index]
    else:
        raise AssertionError("a malformed edit was accepted")
    assert claude.requests == []
