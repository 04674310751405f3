"""Observation masking's invariants over generated agent conversations (policies/mask.py).

Exactly the rules the issue states: no id changes, no pair split, only the content
of tool results older than the last N turns changes, and between two steps the
forwarded list of one request is a prefix of the next one's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.apply import apply
from policies.mask import PLACEHOLDER, first_line, horizon, mask_tool_outputs
from policies.types import Budget, MaskSpec, Message, NoneSpec, TrimSpec
from tests.policies.test_properties import simple_count, unpaired

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def agent_conversation(draw: Any) -> list[dict[str, Any]]:
    """A system prompt, then turns: a user message, tool rounds (calls and results), a reply."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    call = 0
    for t in range(draw(st.integers(1, 10))):
        messages.append({"role": "user", "content": f"task {t}"})
        for _ in range(draw(st.integers(0, 3))):
            ids = []
            for _ in range(draw(st.integers(1, 2))):
                call += 1
                ids.append(f"call_{call}")
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                        for i in ids
                    ],
                }
            )
            for i in ids:
                size = draw(st.integers(0, 3000))
                text = f"result of {i}\n" + "x" * size
                messages.append({"role": "tool", "tool_call_id": i, "content": text})
        messages.append({"role": "assistant", "content": f"done {t}"})
    return messages


SPECS = st.builds(
    MaskSpec,
    after_turns=st.integers(1, 4),
    min_tokens=st.integers(32, 400),
    step_tokens=st.integers(0, 3000),
)


def turn_of(messages: Sequence[Message]) -> list[int]:
    """Each message's turn (counted here, not by policies/): -1 before the first user."""
    out, turn = [], -1
    for m in messages:
        if m.get("role") == "user":
            turn += 1
        out.append(turn)
    return out


def growth(messages: Sequence[Message]) -> list[list[Message]]:
    """Every request an agent would send: each prefix that ends at a user message or at
    the last result of a round of tool calls (never between two results of one round)."""
    out = []
    for i, m in enumerate(messages):
        last_result = m["role"] == "tool" and (
            i + 1 == len(messages) or messages[i + 1]["role"] != "tool"
        )
        if m["role"] == "user" or last_result:
            out.append(list(messages[: i + 1]))
    return out


@SETTINGS
@given(agent_conversation(), SPECS)
def test_only_the_content_of_old_tool_results_changes(messages, spec):
    view = mask_tool_outputs(messages, spec, simple_count)
    turns = turn_of(messages)
    n_turns = max(turns) + 1
    assert len(view.messages) == len(messages)
    masked = {m.index for m in view.masked}
    for i, (before, after) in enumerate(zip(messages, view.messages, strict=True)):
        if i not in masked:
            assert after is before
            continue
        assert before["role"] == "tool"
        assert max(turns[i], 0) < n_turns - spec.after_turns  # older than the last N turns
        assert simple_count(before) >= spec.min_tokens
        assert {k: v for k, v in after.items() if k != "content"} == {
            k: v for k, v in before.items() if k != "content"
        }
        assert after["content"] == PLACEHOLDER.format(
            tokens=simple_count(before), first_line=first_line(before["content"])
        )
        assert simple_count(after) < simple_count(before)


@SETTINGS
@given(agent_conversation(), SPECS)
def test_no_id_changes_and_no_pair_is_split(messages, spec):
    decision = apply(messages, NoneSpec(mask_tool_outputs=spec), simple_count, Budget())
    assert [m.get("tool_call_id") for m in decision.messages] == [
        m.get("tool_call_id") for m in messages
    ]
    assert [m.get("tool_calls") for m in decision.messages] == [
        m.get("tool_calls") for m in messages
    ]
    assert [m["role"] for m in decision.messages] == [m["role"] for m in messages]
    assert unpaired(decision.messages) == set()
    # The decision says what it masked, and what the conversation cost as sent.
    assert decision.tokens_before == sum(map(simple_count, messages))
    assert decision.tokens_after == sum(map(simple_count, decision.messages))
    assert decision.changed == bool(decision.masked)


@SETTINGS
@given(agent_conversation(), SPECS, st.integers(800, 6000))
def test_with_trimming_no_pair_is_split_and_masks_are_only_on_kept_results(messages, spec, limit):
    trim = TrimSpec(max_tokens=limit, low_water=0.7, mask_tool_outputs=spec)
    try:
        decision = apply(messages, trim, simple_count, Budget(limit=limit))
    except Exception as exc:  # the newest turn alone may not fit: nothing to check
        assert type(exc).__name__ == "ContextTooLong"
        return
    assert unpaired(decision.messages) == set()
    kept = set(decision.kept)
    assert all(m.index in kept for m in decision.masked)
    for j, i in enumerate(decision.kept):
        assert decision.messages[j].get("tool_call_id") == messages[i].get("tool_call_id")


@SETTINGS
@given(agent_conversation(), SPECS)
def test_between_two_steps_each_forwarded_list_is_a_prefix_of_the_next(messages, spec):
    policy = NoneSpec(mask_tool_outputs=spec)
    previous: list[Message] | None = None
    previous_masked: set[int] = set()
    steps = 0
    for request in growth(messages):
        decision = apply(request, policy, simple_count, Budget())
        masked = {m.index for m in decision.masked}
        # A mask, once applied, stays (the horizon never moves back).
        assert previous_masked <= masked
        if previous is not None:
            if masked == previous_masked:
                assert decision.messages[: len(previous)] == previous
            else:
                steps += 1
                # A step masks at least step_tokens at once (never one result per turn).
                grown = sum(
                    m.tokens_before for m in decision.masked if m.index not in previous_masked
                )
                assert grown >= spec.step_tokens
        previous, previous_masked = decision.messages, masked


def test_horizon_moves_in_jumps():
    # 500 maskable tokens a turn, 2 turns kept, steps of 1200: the horizon jumps by 3 turns.
    hs = [horizon([500] * t, 2, 1200) for t in range(1, 12)]
    assert hs == [0, 0, 0, 0, 3, 3, 3, 6, 6, 6, 9]
    assert [horizon([500] * t, 2, 0) for t in range(1, 6)] == [0, 0, 1, 2, 3]


def test_placeholder_reads_like_the_issue():
    message = {
        "role": "tool",
        "tool_call_id": "c9",
        "content": "\n  HTTP 200 OK\nbody " + "y" * 5000,
    }
    view = mask_tool_outputs(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "tool_calls": [{"id": "c9", "type": "function"}]},
            message,
            {"role": "user", "content": "b"},
        ],
        MaskSpec(after_turns=1, min_tokens=200, step_tokens=0),
        simple_count,
    )
    tokens = simple_count(message)
    assert view.messages[2] == {
        "role": "tool",
        "tool_call_id": "c9",
        "content": f"[tool output of {tokens:,} tokens omitted: HTTP 200 OK]",
    }
    assert view.masked[0].index == 2 and view.horizon == 1


@SETTINGS
@given(agent_conversation(), SPECS, st.integers(1500, 8000), st.sampled_from([None, 0.7]))
def test_with_a_budget_masks_move_only_where_the_budget_is_crossed(messages, spec, limit, low):
    trim = TrimSpec(max_tokens=limit, low_water=low, mask_tool_outputs=spec)
    previous: Any = None
    previous_request: list[Message] = []
    for request in growth(messages):
        try:
            decision = apply(request, trim, simple_count, Budget(limit=limit))
        except Exception as exc:
            assert type(exc).__name__ == "ContextTooLong"
            previous = None
            continue
        assert unpaired(decision.messages) == set()
        masked = {m.index for m in decision.masked}
        if previous is not None:
            before_masked = {m.index for m in previous.masked}
            same = decision.turns_dropped == previous.turns_dropped and masked == before_masked
            appended = request[len(previous_request) :]
            if same:
                # Nothing moved: the previous forwarded list is this one's prefix.
                assert decision.messages[: len(previous.messages)] == previous.messages
            else:
                # Something moved only because keeping everything would cross the budget.
                kept_all = [*previous.messages, *appended]
                assert sum(map(simple_count, kept_all)) > limit
        previous, previous_request = decision, request
