"""policies/tool_clearing.py: Anthropic's clear_tool_uses edit as stepped clearing."""

from __future__ import annotations

import itertools
from typing import Any

from policies.tool_clearing import ClearToolUses, clear_tool_uses, cleared
from policies.types import Decision, Message


def count(message: Message) -> int:
    """One token per four characters of content (a stand-in tokenizer)."""
    content = message.get("content")
    return 4 + len(content if isinstance(content, str) else "") // 4


def agent(rounds: int, *, tool: str = "read") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for i in range(rounds):
        arguments = f'{{"n": {i}}}'
        call = {
            "id": f"{tool}{i}",
            "type": "function",
            "function": {"name": tool, "arguments": arguments},
        }
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        out.append(
            {"role": "tool", "tool_call_id": f"{tool}{i}", "content": f"result {i} " + "x" * 400}
        )
    return out


def results(messages: list[Any]) -> list[bool]:
    """For each tool result: whether it was cleared."""
    return [m["content"].startswith("[tool output") for m in messages if m["role"] == "tool"]


def test_nothing_is_cleared_below_the_trigger() -> None:
    view = clear_tool_uses(agent(5), ClearToolUses(trigger=10_000, keep=1), count)
    assert view.masked == ()
    assert view.messages == agent(5)


def test_past_the_trigger_all_but_the_newest_kept_tool_uses_are_cleared_in_place() -> None:
    messages = agent(6)
    view = clear_tool_uses(messages, ClearToolUses(trigger=300, keep=2), count)
    assert results(view.messages) == [True, True, True, True, False, False]
    # Same places, same ids: a tool use and its result are never split.
    assert [m.get("tool_call_id") for m in view.messages] == [
        m.get("tool_call_id") for m in messages
    ]
    assert [m["role"] for m in view.messages] == [m["role"] for m in messages]
    assert all(mask.tokens_after < mask.tokens_before for mask in view.masked)


def test_clearing_moves_in_steps_so_the_forwarded_prefix_stays_the_same_between_jumps() -> None:
    edit = ClearToolUses(trigger=300, keep=1, clear_at_least=300)
    cleared_sets = [results(clear_tool_uses(agent(n), edit, count).messages) for n in range(1, 12)]
    jumps = 0
    for before, after in itertools.pairwise(cleared_sets):
        grown = after[: len(before)]
        if grown != before:
            jumps += 1
            assert sum(grown) > sum(before)  # a jump only ever clears more
    assert 0 < jumps < len(cleared_sets) - 1  # not on every request


def test_excluded_tools_are_never_cleared_and_inputs_are_cleared_on_request() -> None:
    messages = agent(4, tool="search") + agent(3)[1:]
    edit = ClearToolUses(
        trigger=100, keep=1, exclude_tools=frozenset({"search"}), clear_inputs=True
    )
    view = clear_tool_uses(messages, edit, count)
    names = [m["tool_calls"][0]["function"]["name"] for m in messages if m.get("tool_calls")]
    assert [c for c, n in zip(results(view.messages), names, strict=True) if n == "search"] == [
        False
    ] * 4
    cleared_ids = {
        m["tool_call_id"]
        for m in view.messages
        if m["role"] == "tool" and m["content"].startswith("[tool output")
    }
    assert cleared_ids == {"read0", "read1"}  # the read calls but the newest
    for message in (m for m in view.messages if m.get("tool_calls")):
        call = message["tool_calls"][0]
        emptied = call["function"]["arguments"] == "{}"
        assert emptied == (call["id"] in cleared_ids)
    assert messages == agent(4, tool="search") + agent(3)[1:]  # nothing mutated


def test_a_decision_cleared_says_so_in_its_masks_and_token_count() -> None:
    messages = agent(5)
    decision = Decision(
        messages=list(messages), kept=tuple(range(len(messages))), tokens_after=1000
    )
    out = cleared(decision, ClearToolUses(trigger=100, keep=2), count)
    assert out.changed
    assert [m.index for m in out.masked] == [2, 4, 6]
    assert out.tokens_after == 1000 - sum(m.tokens_before - m.tokens_after for m in out.masked)
    assert out.extra["cleared_tool_uses"] == 3
