"""proxy/messages/view.py: Anthropic messages as the chat model and back, exactly."""

from __future__ import annotations

from typing import Any
from unittest.mock import ANY

import pytest

from policies.mask import placeholder
from proxy.errors import InvalidRequest
from proxy.messages.view import ORIGIN, anthropic_request, chat_view, check_request
from tests.messages.test_policies_e2e import tool_conversation

EPHEMERAL = {"type": "ephemeral"}


def conversation() -> list[dict[str, Any]]:
    out = tool_conversation(4, thinking=True)
    out[1]["content"].insert(1, {"type": "redacted_thinking", "data": "opaque"})
    out[2]["content"][0] |= {"is_error": True, "cache_control": EPHEMERAL}
    out.append({"role": "assistant", "content": "Done."})
    out.append({"role": "user", "content": [{"type": "text", "text": "thanks"}]})
    return out


def test_a_conversation_read_into_the_chat_model_is_written_back_as_it_came() -> None:
    messages = conversation()
    system: Any = [{"type": "text", "text": "rules", "cache_control": EPHEMERAL}]
    view = chat_view({"system": system, "messages": messages})
    assert [m["role"] for m in view[:6]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert view[2]["tool_calls"][0]["id"] == "toolu_0"
    assert view[3]["tool_call_id"] == "toolu_0"
    assert anthropic_request(view, system) == (system, messages)


def test_a_tool_result_the_policy_replaced_keeps_its_other_fields() -> None:
    messages = conversation()
    view = chat_view({"messages": messages})
    at = next(i for i, m in enumerate(view) if m["role"] == "tool")
    view[at] = placeholder(view[at], 250)
    _, back = anthropic_request(view, None)
    block = back[2]["content"][0]
    assert block["content"].startswith("[tool output of 250 tokens omitted")
    assert block["is_error"] is True and block["cache_control"] == EPHEMERAL
    assert block["tool_use_id"] == "toolu_0"
    # Everything else as it came: thinking, signatures, the other results.
    assert back[:2] == messages[:2] and back[3:] == messages[3:]


def test_the_proxys_own_messages_are_text_and_a_summary_joins_the_system() -> None:
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    view = chat_view({"system": "rules", "messages": messages})
    summary = {"role": "system", "content": "## Summary"}
    recall = {"role": "user", "content": "<recalled/>"}
    system, back = anthropic_request([view[0], summary, recall, *view[1:]], "rules")
    assert system == "rules\n\n## Summary"
    assert back == [{"role": "user", "content": "<recalled/>"}, {"role": "user", "content": "hi"}]
    assert all(ORIGIN not in m for m in back)


def test_a_compaction_block_reads_as_its_summary_and_is_written_back_as_it_came() -> None:
    block = {"type": "compaction", "content": "Summary: port 8731.", "encrypted_content": "x" * 99}
    failed = {"type": "compaction", "content": None}
    body: Any = {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [block, failed, {"type": "text", "text": "Go."}]},
        ]
    }
    viewed = chat_view(body)
    assert viewed[1]["content"] == [
        {"type": "text", "text": "Summary: port 8731."},
        {"type": "text", "text": "Go."},
    ]
    assert anthropic_request(viewed, None)[1] == body["messages"]


def test_a_system_turn_inside_messages_stays_in_its_place_as_it_came() -> None:
    # Claude Code sends its environment as a system message after the first user one
    # (the API's mid-conversation system turns): blocks on one request, a string on the next.
    blocks: Any = [{"type": "text", "text": "# Environment", "cache_control": EPHEMERAL}]
    for content in (blocks, "# Environment"):
        messages: list[Any] = [
            {"role": "user", "content": "Check build.log"},
            {"role": "system", "content": content},
            *tool_conversation(2)[1:],
        ]
        view = chat_view({"system": "rules", "messages": messages})
        assert view[2] == {"role": "system", "content": "# Environment", ORIGIN: ANY}
        assert anthropic_request(view, "rules") == ("rules", messages)
        # Masked or not, the policy's messages keep it where it was.
        at = next(i for i, m in enumerate(view) if m["role"] == "tool")
        view[at] = placeholder(view[at], 250)
        _, back = anthropic_request(view, "rules")
        assert back[:3] == messages[:3] and back[4:] == messages[4:]
        assert back[3]["content"][0]["content"].startswith("[tool output of 250 tokens")


def test_a_system_turn_with_other_than_text_blocks_is_a_400() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
    body = {"model": "m", "messages": [{"role": "system", "content": [image]}]}
    with pytest.raises(InvalidRequest, match="a system message holds text blocks only"):
        check_request(body)
