"""Turns and tool-call pairing on small, hand-written conversations."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings

from policies.units import find_orphans, split_turns
from tests.policies.test_properties import SYSTEM, conversations, units_of, unpaired


def sys(text: str = "rules", role: str = "system") -> dict[str, Any]:
    return {"role": role, "content": text}


def user(text: str = "hi") -> dict[str, Any]:
    return {"role": "user", "content": text}


def say(text: str = "ok") -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def calls(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
        ],
    }


def result(call_id: str, text: str = "done") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def test_a_turn_is_a_user_message_and_everything_until_the_next() -> None:
    messages = [sys(), user(), calls("a"), result("a"), say(), user(), say()]
    turns = split_turns(messages)
    assert turns.system == (0,)
    assert turns.leading == ()
    assert turns.turns == ((1, 2, 3, 4), (5, 6))
    assert turns.units == turns.turns


def test_system_and_developer_messages_belong_to_no_turn_wherever_they_are() -> None:
    messages = [user(), sys("mid", "developer"), say(), sys(), user()]
    turns = split_turns(messages)
    assert turns.system == (1, 3)
    assert turns.turns == ((0, 2), (4,))


def test_messages_before_the_first_user_message_form_a_leading_pseudo_turn() -> None:
    messages = [sys(), say("Hello! How can I help?"), user(), say()]
    turns = split_turns(messages)
    assert turns.leading == (1,)
    assert turns.units == ((1,), (2, 3))


def test_a_conversation_without_user_messages_is_all_pseudo_turn() -> None:
    turns = split_turns([sys(), say(), say()])
    assert turns.turns == ()
    assert turns.units == ((1, 2),)
    assert split_turns([]).units == ()


def test_legacy_function_messages_stay_in_their_turn() -> None:
    fn_call = {"role": "assistant", "content": None, "function_call": {"name": "f"}}
    fn_result = {"role": "function", "name": "f", "content": "42"}
    messages = [user(), fn_call, fn_result, say()]
    assert split_turns(messages).turns == ((0, 1, 2, 3),)
    assert find_orphans(messages) == ()


def test_complete_tool_rounds_have_no_orphans_in_any_result_order() -> None:
    messages = [user(), calls("a", "b", "c"), result("c"), result("a"), result("b"), say()]
    assert find_orphans(messages) == ()


def test_a_system_message_inside_a_tool_round_does_not_break_the_pair() -> None:
    messages = [user(), calls("a", "b"), result("a"), sys("note"), result("b")]
    assert find_orphans(messages) == ()


def test_a_call_missing_a_result_is_an_orphan_with_the_results_it_got() -> None:
    messages = [user(), calls("a", "b"), result("a"), say(), user()]
    assert find_orphans(messages) == (1, 2)


def test_a_call_with_no_result_at_all_is_an_orphan() -> None:
    assert find_orphans([user(), calls("a")]) == (1,)


def test_a_result_without_its_call_is_an_orphan() -> None:
    messages = [user(), result("nobody"), say(), calls("a"), result("a"), result("zzz")]
    assert find_orphans(messages) == (1, 5)


def test_a_second_result_for_the_same_call_is_an_orphan() -> None:
    messages = [user(), calls("a"), result("a"), result("a")]
    assert find_orphans(messages) == (3,)


def test_a_result_separated_from_its_call_by_a_user_message_is_an_orphan() -> None:
    messages = [user(), calls("a"), user(), result("a")]
    assert find_orphans(messages) == (1, 3)


def test_a_call_without_an_id_can_never_be_answered() -> None:
    broken = {"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}
    assert find_orphans([user(), broken, result("a")]) == (1, 2)


def test_an_empty_tool_calls_list_is_a_plain_assistant_message() -> None:
    message = {"role": "assistant", "content": "hi", "tool_calls": []}
    assert find_orphans([user(), message]) == ()


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_turns_and_orphans_agree_with_the_reference_definitions(messages: list) -> None:
    """Against the oracle in test_policies_properties, written independently."""
    turns = split_turns(messages)
    assert [list(u) for u in turns.units] == units_of(messages, set())
    assert list(turns.system) == [i for i, m in enumerate(messages) if m["role"] in SYSTEM]
    assert set(find_orphans(messages)) == unpaired(messages)
