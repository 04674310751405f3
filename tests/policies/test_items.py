"""Responses API items as policy units: turns, pairs, reasoning, pinned and unknown items.

The property tests check each rule with an oracle of their own (spans and
pairs recomputed here from the generated conversation's structure, not taken
from policies/items.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.items import apply_items, clip_item_output, item_layout, trim_items
from policies.trim import MARKER
from policies.types import (
    Budget,
    ContextTooLong,
    Decision,
    Message,
    NoneSpec,
    SummarizeSpec,
    TrimSpec,
)


def count(item: Message) -> int:
    """A deterministic stand-in for a tokenizer: 3 per item, 1 per 4 characters of text."""
    text = "".join(
        str(item.get(k) or "") for k in ("content", "arguments", "output", "encrypted_content")
    )
    return 3 + len(text) // 4


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def said(text: str, n: int = 0) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{n}",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def call(call_id: str, args: str = "{}") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": args}


def output(call_id: str, text: str = "result") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def reasoning(n: int) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": "x" * 8}


def kept(decision: Decision, items: Sequence[Message]) -> list[Message]:
    return [items[i] for i in decision.kept]


# -- layout -----------------------------------------------------------------------


def test_turns_start_at_user_messages_and_system_developer_compaction_are_pinned() -> None:
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "zz"},
        said("greeting"),
        user("a"),
        said("A"),
        {"type": "message", "role": "system", "content": "mid"},
        user("b"),
    ]
    layout = item_layout(items)

    assert list(layout.system) == [0, 1, 5]
    assert list(layout.starts) == [3, 6]
    assert layout.orphans == ()


def test_a_user_message_inside_a_call_pair_or_after_reasoning_starts_no_turn() -> None:
    items = [user("a"), call("c1"), user("aside"), output("c1"), reasoning(1), user("b"), said("B")]
    assert list(item_layout(items).starts) == [0]


def test_unanswered_calls_stray_outputs_and_their_reasoning_are_orphans() -> None:
    items = [
        user("a"),
        reasoning(1),
        call("c1"),  # never answered
        output("nope"),  # answers nothing
        call("c2"),
        output("c2"),
        output("c2"),  # a second answer
        user("b"),
    ]
    assert item_layout(items).orphans == (1, 2, 3, 6)


def test_only_string_tool_outputs_are_clippable() -> None:
    parts = {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text"}]}
    items = [user("a"), call("c1"), output("c1"), call("c2"), parts]
    assert list(item_layout(items).clippable) == [2]


# -- trimming ---------------------------------------------------------------------


def five_turns() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "developer", "content": "be brief"}]
    for t in range(5):
        items.append(user(f"question {t}"))
        if t % 2:
            items += [reasoning(t), call(f"c{t}"), output(f"c{t}")]
        items.append(said(f"answer {t}", t))
    return items


def test_max_turns_keeps_pinned_items_and_exactly_the_last_turns() -> None:
    items = five_turns()
    decision = trim_items(items, TrimSpec(max_turns=2), count, Budget())

    start = items.index(user("question 3"))
    assert kept(decision, items) == [items[0], *items[start:]]
    assert decision.turns_dropped == 3
    assert decision.reason == "max_turns"
    assert all(a is b for a, b in zip(decision.messages, kept(decision, items), strict=True))


def test_token_budget_cuts_whole_turns_and_fits() -> None:
    items = five_turns()
    total = sum(map(count, items))
    decision = trim_items(items, TrimSpec(max_tokens=total // 2), count, Budget(fixed=3))

    assert decision.reason == "max_tokens"
    assert decision.tokens_after <= total // 2
    first = decision.kept[1]
    assert items[first]["role"] == "user"


def test_older_tool_output_is_clipped_with_the_chat_marker() -> None:
    big = "x" * 4000
    items = [user("a"), call("c1"), output("c1", big), said("A"), user("b")]
    decision = trim_items(
        items, TrimSpec(max_tokens=500, tool_output_max_tokens=100), count, Budget()
    )

    assert [c.index for c in decision.clipped] == [2]
    clipped = decision.messages[2]
    assert clipped["call_id"] == "c1" and clipped["type"] == "function_call_output"
    assert MARKER.split("{")[0] in clipped["output"]
    assert count(clipped) <= 100


def test_clip_item_output_leaves_parts_and_small_outputs_alone() -> None:
    assert clip_item_output(output("c", "short"), 100, count) is None
    parts = {
        "type": "function_call_output",
        "call_id": "c",
        "output": [{"type": "input_text", "text": "x" * 999}],
    }
    assert clip_item_output(parts, 10, count) is None


def test_newest_turn_over_budget_is_context_too_long() -> None:
    items = [user("a" * 400)]
    with pytest.raises(ContextTooLong):
        trim_items(items, TrimSpec(max_tokens=20), count, Budget())


def test_passthrough_counts_everything_and_changes_nothing() -> None:
    items = five_turns()
    decision = apply_items(items, NoneSpec(), count, Budget(fixed=7))

    assert decision.messages == items and not decision.changed
    assert decision.tokens_before == decision.tokens_after == sum(map(count, items)) + 7


def test_a_summarize_policy_trims_items_within_its_limits_and_says_so() -> None:
    items = five_turns()
    spec = SummarizeSpec(trigger_turns=2, max_tokens=10_000, keep_last_turns=1)
    decision = apply_items(items, spec, count, Budget())

    assert decision.extra["fallback"] == "items_not_summarized"
    assert decision.turns_dropped == 3 and decision.reason == "max_turns"


# -- properties -------------------------------------------------------------------

UNKNOWN = {"type": "future_tool_call", "payload": {"a": [1, 2]}}


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Well-formed item lists: turns of calls, outputs, reasoning; pinned and unknown items."""
    items: list[dict[str, Any]] = []
    n = 0
    if draw(st.booleans()):
        items.append({"role": "developer", "content": "d" * draw(st.integers(0, 40))})
    if draw(st.booleans()):
        items.append(said("leading " * draw(st.integers(0, 10)), -1))
    for t in range(draw(st.integers(1, 7))):
        items.append(user("u" * draw(st.integers(0, 80))))
        for _ in range(draw(st.integers(0, 3))):
            n += 1
            step = draw(
                st.sampled_from(["calls", "text", "cut", "unknown", "compaction", "system"])
            )
            if step == "calls":
                ids = [f"c{t}_{n}_{k}" for k in range(draw(st.integers(1, 3)))]
                if draw(st.booleans()):
                    items.append(reasoning(n))
                items += [call(i, "a" * draw(st.integers(0, 60))) for i in ids]
                if draw(st.integers(0, 4)) == 0:
                    items.append(user("while the tool runs"))  # inside the pair: no turn starts
                items += [output(i, "o" * draw(st.integers(0, 300))) for i in ids]
            elif step == "text":
                if draw(st.booleans()):
                    items.append(reasoning(n))
                items.append(said("s" * draw(st.integers(0, 80)), n))
            elif step == "cut":
                # A response that ended in reasoning: the next thing is the user's.
                items.append(reasoning(n))
                items.append(user("go on"))
            elif step == "unknown":
                items.append({**UNKNOWN, "n": n})
            elif step == "compaction":
                items.append(
                    {"type": "compaction", "id": f"cmp_{n}", "encrypted_content": "e" * 20}
                )
            else:
                items.append({"type": "message", "role": "system", "content": "s"})
    return items


def spec_and_budget(draw: st.DrawFn) -> tuple[TrimSpec, Budget]:
    spec = TrimSpec(
        max_turns=draw(st.none() | st.integers(1, 6)),
        max_tokens=draw(st.none() | st.integers(20, 600)),
        low_water=draw(st.none() | st.floats(0.3, 1.0)),
        tool_output_max_tokens=draw(st.none() | st.integers(16, 80)),
    )
    if spec.max_turns is None and spec.max_tokens is None:
        spec = TrimSpec(max_turns=2, tool_output_max_tokens=spec.tool_output_max_tokens)
    return spec, Budget(limit=spec.max_tokens, fixed=draw(st.integers(0, 20)))


def turn_starts(items: Sequence[Message]) -> set[int]:
    """User messages neither right after reasoning nor between a call and its output."""
    where = {x.get("call_id"): i for i, x in enumerate(items) if x.get("type") == "function_call"}
    inside: set[int] = set()
    for j, x in enumerate(items):
        if x.get("type") == "function_call_output":
            inside.update(range(where[x["call_id"]] + 1, j))
    return {
        i
        for i, x in enumerate(items)
        if x.get("role") == "user"
        and i not in inside
        and not (i and items[i - 1].get("type") == "reasoning")
    }


def pinned(item: Message) -> bool:
    return item.get("role") in ("system", "developer") or item.get("type") == "compaction"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_trimmed_items_keep_every_rule(data: st.DataObject) -> None:
    items = data.draw(conversations())
    spec, budget = spec_and_budget(data.draw)
    try:
        decision = trim_items(items, spec, count, budget)
    except ContextTooLong:
        # Only when the pinned items and the newest unit, unclipped, are over the limit.
        assert spec.max_tokens is not None
        newest = max(turn_starts(items))
        floor = sum(count(x) for x in items if pinned(x)) + budget.fixed
        floor += sum(count(x) for x in items[newest:] if not pinned(x))
        assert floor > spec.max_tokens
        return

    keep = set(decision.kept)
    out = decision.messages
    # Order is kept, and nothing is invented.
    assert list(decision.kept) == sorted(keep)
    # Well-formed input: nothing to repair.
    assert decision.repaired == ()
    # Pinned items always pass, as the same objects.
    for i, item in enumerate(items):
        if pinned(item):
            assert i in keep
    for i, item in zip(decision.kept, out, strict=True):
        if item is not items[i]:
            # Only tool outputs are ever changed, and only by clipping.
            assert (
                items[i]["type"] == "function_call_output"
                and item["call_id"] == items[i]["call_id"]
            )
    # Calls and outputs stay paired.
    calls = {x["call_id"] for x in out if x.get("type") == "function_call"}
    outputs = {x["call_id"] for x in out if x.get("type") == "function_call_output"}
    assert calls == outputs
    # A reasoning item stays with the item that follows it.
    for i, item in enumerate(items):
        if item.get("type") == "reasoning":
            assert (i in keep) == (i + 1 in keep)
    # Unknown items are forwarded untouched or dropped with their turn.
    for i in keep:
        if items[i].get("type") == "future_tool_call":
            assert out[decision.kept.index(i)] is items[i]
    # The newest turn is always kept whole.
    newest = max(turn_starts(items))
    assert set(range(newest, len(items))) <= keep
    # Counted, and within the limits.
    assert decision.tokens_after == sum(map(count, out)) + budget.fixed
    if spec.max_tokens is not None:
        assert decision.tokens_after <= spec.max_tokens
    if spec.max_turns is not None:
        assert sum(1 for i in keep if i in turn_starts(items)) <= spec.max_turns
