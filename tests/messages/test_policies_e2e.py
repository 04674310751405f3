"""Policies over content blocks, through /v1/messages: what reached the Anthropic upstream.

A long tool-using conversation under a trim policy never has a tool_use split from its
tool_result; thinking blocks and their signatures arrive as the client sent them, even
when the policy rewrote the request; the client's cache_control markers stay where they
were and the proxy adds its one breakpoint only where there is room.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

from tests.fakes.anthropic import FakeAnthropic, Reply
from tests.harness import ProxyServer
from tests.messages.sdk import sdk_client

MODEL = "claude-fake-1"
FILLER = "lorem ipsum dolor sit amet " * 40  # ~240 tokens of tool output


def tool_conversation(rounds: int, *, thinking: bool = False) -> list[dict[str, Any]]:
    """A user task and ``rounds`` tool calls with their results (Claude Code's shape: the
    result and a reminder text in one user message)."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in the repo."}]
    for i in range(rounds):
        call: list[dict[str, Any]] = []
        if thinking:
            call.append({"type": "thinking", "thinking": f"step {i}", "signature": f"sig-{i}"})
        call += [
            {"type": "text", "text": f"Reading file {i}."},
            {"type": "tool_use", "id": f"toolu_{i}", "name": "read", "input": {"n": i}},
        ]
        out.append({"role": "assistant", "content": call})
        content: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"{i}: {FILLER}"}
        ]
        if i % 3 == 2:
            content.append({"type": "text", "text": f"reminder {i}"})
        out.append({"role": "user", "content": content})
    return out


def check_pairs(messages: Sequence[dict[str, Any]]) -> None:
    """Every tool_result answers a tool_use of the assistant message right before it, and
    every tool_use is answered in the user message right after it."""
    assert messages[0]["role"] == "user"
    for i, message in enumerate(messages):
        content = message["content"]
        if not isinstance(content, list):
            continue
        if message["role"] == "assistant":
            calls = {b["id"] for b in content if b["type"] == "tool_use"}
            after = messages[i + 1]["content"] if i + 1 < len(messages) else []
            answered = {b["tool_use_id"] for b in after if b["type"] == "tool_result"}
            assert calls <= answered, f"message {i}: unanswered {calls - answered}"
        else:
            results = {b["tool_use_id"] for b in content if b["type"] == "tool_result"}
            before = messages[i - 1]["content"] if i else []
            calls = {b["id"] for b in before if isinstance(b, dict) and b["type"] == "tool_use"}
            assert results <= calls, f"message {i}: results without their call"


def test_trimming_a_long_tool_conversation_never_splits_a_tool_use_from_its_result(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"},
        {"strategy": "trim", "max_tokens": 2500},
    )
    client = sdk_client(proxy)
    history = tool_conversation(30)
    for cut in (12, 31, 45, 61):
        claude.script(Reply(text="ok"))
        client.messages.create(model=MODEL, max_tokens=32, messages=history[:cut])
    forwarded = [r.json["messages"] for r in claude.requests]
    assert len(forwarded[-1]) < 61, "the policy trimmed nothing"
    for messages in forwarded:
        check_pairs(messages)
    # What was kept is the client's own blocks, in order: the newest messages as sent.
    assert forwarded[-1][-1]["content"] == history[60]["content"]


def test_thinking_blocks_and_signatures_reach_the_upstream_unchanged_under_a_rewrite(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"},
        {
            "strategy": "trim",
            "max_turns": 50,
            "mask_tool_outputs": {"after_turns": 1, "min_tokens": 50, "step_tokens": 0},
        },
    )
    claude.script(Reply(text="Done.", thinking=("Let me think.", "sig-final")))
    history = tool_conversation(6, thinking=True)
    answer = sdk_client(proxy).messages.create(
        model=MODEL,
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=history,
    )
    # The answer's own thinking block reaches the client with its signature.
    assert answer.content[0].type == "thinking"
    assert answer.content[0].signature == "sig-final"
    sent = claude.requests[0].json["messages"]
    # Masking rewrote old tool results (so the request was rebuilt) ...
    results = [b for m in sent for b in m["content"] if isinstance(m["content"], list)]
    masked = [b for b in results if b["type"] == "tool_result" and FILLER not in str(b)]
    assert masked, "nothing was masked"
    # ... and every assistant message is the client's, thinking and signature included
    # (the last one carries the proxy's breakpoint on its tool_use, not on the thinking).
    assistants = [m for m in sent if m["role"] == "assistant"]
    last = assistants[-1]["content"]
    assert last[-1].pop("cache_control") == {"type": "ephemeral"}
    assert assistants == [m for m in history if m["role"] == "assistant"]
    check_pairs(sent)


def marks(body: dict[str, Any]) -> list[tuple[str, int, int]]:
    """Where cache_control markers are: ("system", i, 0), ("messages", i, j)."""
    out = []
    system = body.get("system")
    for i, block in enumerate(system if isinstance(system, list) else []):
        if block.get("cache_control"):
            out.append(("system", i, 0))
    for i, message in enumerate(body["messages"]):
        content = message["content"]
        for j, block in enumerate(content if isinstance(content, list) else []):
            if block.get("cache_control"):
                out.append(("messages", i, j))
    return out


def test_the_clients_cache_markers_stay_and_the_proxy_adds_one_only_where_there_is_room(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"},
        {"strategy": "trim", "max_turns": 2},
    )
    client = sdk_client(proxy)
    ephemeral: Any = {"type": "ephemeral"}
    system: Any = [{"type": "text", "text": "You are a coder.", "cache_control": ephemeral}]
    turns: list[Any] = []
    for i in range(4):
        turns.append({"role": "user", "content": [{"type": "text", "text": f"question {i}"}]})
        turns.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {i}"}]})
    turns.append(
        {
            "role": "user",
            "content": [{"type": "text", "text": "last", "cache_control": ephemeral}],
        }
    )
    client.messages.create(model=MODEL, max_tokens=16, system=system, messages=turns)
    body = claude.requests[0].json
    # Trimmed to the last 2 turns: the client's markers on the same blocks, and the
    # proxy's one at the end of the stable prefix (the message before the newest).
    assert body["system"] == system
    assert [m["content"][0]["text"] for m in body["messages"]] == [
        "question 3",
        "answer 3",
        "last",
    ]
    assert marks(body) == [("system", 0, 0), ("messages", 1, 0), ("messages", 2, 0)]
    # Four markers of the client's own: the proxy adds none.
    full: Any = [
        {
            "role": m["role"],
            "content": [{**m["content"][0], "cache_control": ephemeral}],
        }
        for m in turns[-3:]
    ]
    client.messages.create(model=MODEL, max_tokens=16, system=system, messages=full)
    body = claude.requests[1].json
    assert marks(body) == [
        ("system", 0, 0),
        ("messages", 0, 0),
        ("messages", 1, 0),
        ("messages", 2, 0),
    ]
    assert body["messages"] == full


def test_recall_brings_a_dropped_turn_back_before_the_newest_message(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"},
        {"strategy": "trim", "max_turns": 3, "recall": {"max_tokens": 300, "neighbors": 1}},
    )
    client = sdk_client(proxy, session="s-recall")
    order = "My order number is 88412-KX, deliver it to 17 Quai des Celestins, Lyon."
    history: list[Any] = []
    for t in range(1, 9):
        text = order if t == 2 else f"Turn {t}: tell me about topic {t}, please."
        if t == 8:
            text = "Remind me, what delivery address did I give for the order?"
        history.append({"role": "user", "content": [{"type": "text", "text": text}]})
        claude.script(Reply(text=f"answer {t}"))
        raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=16, messages=history)
        history.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {t}"}]})
        proxy.drain()
    assert raw.headers["x-context-recall"] == "recalled"
    sent = claude.requests[-1].json["messages"]
    # The dropped turn is back, quoted in a user message right before the question.
    assert order not in json.dumps(sent[:-2])
    assert sent[-2]["role"] == "user" and "88412-KX" in json.dumps(sent[-2])
    assert sent[-1] == history[-2]
    # The proxy's breakpoint ends the stable prefix, before the recall block.
    assert marks(claude.requests[-1].json) == [("messages", len(sent) - 3, 0)]


def without_marks(messages: list[dict[str, Any]]) -> list[Any]:
    return [
        {
            **m,
            "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]
            if isinstance(m["content"], list)
            else m["content"],
        }
        for m in messages
    ]


def test_the_forwarded_prefix_holds_between_the_trims_hysteresis_jumps(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"},
        {"strategy": "trim", "max_tokens": 3000, "low_water": 0.6},
    )
    client = sdk_client(proxy, session="s-stable")
    history = tool_conversation(24)
    for cut in range(3, len(history) + 1, 2):  # one agent step at a time
        claude.script(Reply(text="ok"))
        client.messages.create(model=MODEL, max_tokens=8, messages=history[:cut])
    sent = [without_marks(r.json["messages"]) for r in claude.requests]
    kept_prefix = [
        len(after) >= len(before) and after[: len(before)] == before
        for before, after in itertools.pairwise(sent)
    ]
    # Trimmed at all, and the prefix moved only at a few jumps, not on every request.
    assert len(sent[-1]) < len(history)
    jumps = kept_prefix.count(False)
    assert 0 < jumps <= len(kept_prefix) // 4, kept_prefix
    for messages in sent:
        check_pairs(messages)
