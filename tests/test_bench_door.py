"""``--door anthropic`` of bench/recall.py and bench/replay.py: a conversation goes through
the Messages door's view, tool calls and their results paired, what is forwarded checked
as Anthropic checks a request."""

from __future__ import annotations

from typing import Any

import pytest

from bench import door, replay
from policies.types import TrimSpec
from proxy.context.tokens import TiktokenCounter
from proxy.messages.view import ORIGIN


def tau_like() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "find", "arguments": '{"q": 1}'}}
    return [
        {"role": "system", "content": "You are an airline agent."},
        {"role": "user", "content": "Find my booking."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "booking ABC"},
        {"role": "assistant", "content": "It is ABC."},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You are welcome."},
    ]


def test_the_anthropic_door_writes_tool_calls_as_blocks_and_reads_them_back_paired() -> None:
    body = door.anthropic_body(tau_like())
    assert body["system"] == "You are an airline agent."
    assert [m["role"] for m in body["messages"]] == ["user", "assistant"] * 3
    assert body["messages"][1]["content"] == [
        {"type": "tool_use", "id": "c1", "name": "find", "input": {"q": 1}}
    ]
    assert body["messages"][2]["content"][0]["type"] == "tool_result"
    viewed = door.through("anthropic", tau_like())
    assert [m["role"] for m in viewed] == [m["role"] for m in tau_like()]
    assert viewed[2]["tool_calls"][0]["id"] == "c1" and viewed[3]["tool_call_id"] == "c1"
    assert all(ORIGIN in m for m in viewed)  # the door's own view, not the chat messages
    assert door.through("openai", tau_like()) == tau_like()


@pytest.mark.parametrize("name", door.DOORS)
def test_a_forwarded_list_with_a_call_cut_from_its_result_is_invalid_on_either_door(
    name: str,
) -> None:
    viewed = door.through(name, tau_like())
    assert not door.invalid(name, viewed)
    assert door.invalid(name, [viewed[0], viewed[1], viewed[2], *viewed[4:]])  # result gone
    assert door.invalid(name, [viewed[0], viewed[1], *viewed[3:]])  # call gone


def test_replay_through_the_anthropic_door_counts_what_a_trim_forwards() -> None:
    conversation = door.through("anthropic", tau_like())
    stats = replay.replay(
        [conversation], TrimSpec(max_turns=1), TiktokenCounter("gpt-4o"), "anthropic"
    )
    assert stats.requests == 2 and stats.invalid == 0
    assert stats.sent[-1] < stats.full[-1]  # the first turn was trimmed


def test_the_door_option_parses_and_rejects_an_unknown_door() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    door.add_door_option(parser)
    assert parser.parse_args([]).door == "openai"
    assert parser.parse_args(["--door", "anthropic"]).door == "anthropic"
    with pytest.raises(SystemExit):
        parser.parse_args(["--door", "gemini"])
