"""`strategy: trim` on small, hand-written conversations, with a simple token count."""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import trim as trim_module
from policies.apply import apply
from policies.trim import MARKER, budget_limit, clip_tool_result, trim
from policies.types import Budget, ContextTooLong, NoneSpec, TrimSpec
from tests.policies.test_properties import assert_obeys_rules, simple_count
from tests.policies.test_units import calls, result, say, sys, user


def sized(role: str, tokens: int, **fields: Any) -> dict[str, Any]:
    """A message that costs exactly ``tokens`` under simple_count."""
    return {"role": role, "content": "x" * (4 * (tokens - 3)), **fields}


def tool_turns(count: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [sys()]
    for t in range(count):
        cid = f"call_{t}"
        messages += [user(f"q{t}"), calls(cid), result(cid, f"r{t}"), say(f"a{t}")]
    return messages


def run(messages: list[dict[str, Any]], spec: TrimSpec, fixed: int = 0, limit: int | None = None):
    budget = Budget(limit=limit if limit is not None else spec.max_tokens, fixed=fixed)
    decision = trim(messages, spec, simple_count, budget)
    assert_obeys_rules(messages, spec, simple_count, budget, decision)
    return decision


def test_max_turns_keeps_system_and_exactly_the_last_turns_with_their_tool_pairs() -> None:
    messages = tool_turns(10)
    d = run(messages, TrimSpec(max_turns=3))
    assert d.kept == (0, *range(29, 41))
    assert [m["content"] for m in d.messages if m["role"] == "user"] == ["q7", "q8", "q9"]
    assert d.turns_dropped == 7 and d.reason == "max_turns"
    assert all(out is messages[i] for out, i in zip(d.messages, d.kept, strict=True))
    assert d.tokens_after < d.tokens_before


def test_max_turns_below_one_still_keeps_the_newest_turn() -> None:
    d = run(tool_turns(3), TrimSpec(max_turns=0))
    assert d.kept == (0, 9, 10, 11, 12)


def test_system_messages_are_the_same_objects_at_their_places_among_kept_messages() -> None:
    note = sys("mid-conversation note", "developer")
    messages = [sys(), user("old"), note, say(), user("new"), sys("late"), say()]
    d = run(messages, TrimSpec(max_turns=1))
    assert d.kept == (0, 2, 4, 5, 6)
    assert d.messages[1] is note and d.messages[0] is messages[0]


def test_an_orphan_tool_result_is_dropped_and_recorded() -> None:
    messages = [sys(), user(), result("call_nobody"), say()]
    d = run(messages, TrimSpec(max_turns=5))
    assert d.kept == (0, 1, 3)
    assert d.repaired == (2,) and d.dropped == (2,) and d.reason == "orphan"
    assert d.turns_dropped == 0


def test_an_assistant_message_whose_calls_lack_results_is_dropped_and_recorded() -> None:
    messages = [sys(), user(), calls("a", "b"), result("a"), say("done"), user("next")]
    d = run(messages, TrimSpec(max_turns=5))
    assert d.kept == (0, 1, 4, 5)
    assert d.repaired == (2, 3) and d.reason == "orphan"


def test_a_leading_pseudo_turn_is_dropped_first() -> None:
    messages = [sys(), say("Hello! How can I help?"), user("q1"), say(), user("q2")]
    d = run(messages, TrimSpec(max_turns=2))
    assert d.kept == (0, 2, 3, 4) and d.turns_dropped == 1


def test_max_tokens_keeps_as_many_newest_turns_as_fit() -> None:
    messages = [sized("system", 50)]
    for _ in range(6):
        messages += [sized("user", 40), sized("assistant", 60)]
    d = run(messages, TrimSpec(max_tokens=370), fixed=10)
    # 50 system + 10 fixed + 3 turns of 100 = 360; a fourth would be 460.
    assert d.turns_dropped == 3 and d.reason == "max_tokens"
    assert d.tokens_after == 360 and d.budget == 370


def test_the_stricter_of_max_turns_and_max_tokens_wins() -> None:
    messages = []
    for _ in range(6):
        messages += [sized("user", 50), sized("assistant", 50)]
    by_tokens = run(messages, TrimSpec(max_turns=4, max_tokens=250))
    assert by_tokens.turns_dropped == 4 and by_tokens.reason == "max_tokens"
    by_turns = run(messages, TrimSpec(max_turns=1, max_tokens=450))
    assert by_turns.turns_dropped == 5 and by_turns.reason == "max_turns"
    tie = run(messages, TrimSpec(max_turns=2, max_tokens=200))
    assert tie.turns_dropped == 4 and tie.reason == "max_turns"
    assert tie.extra["dropped_by"] == {"max_turns": 8, "max_tokens": 8, "orphan": 0}


def test_nothing_dropped_means_no_reason() -> None:
    d = run(tool_turns(2), TrimSpec(max_turns=5, max_tokens=10_000))
    assert d.reason is None and not d.changed and d.dropped == ()


def test_context_too_long_reports_what_the_newest_turn_needs() -> None:
    messages = [sized("system", 100), sized("user", 30), sized("user", 200)]
    with pytest.raises(ContextTooLong) as caught:
        trim(messages, TrimSpec(max_tokens=250), simple_count, Budget(limit=250, fixed=10))
    assert (caught.value.needed, caught.value.budget) == (310, 250)
    assert "310" in str(caught.value) and "250" in str(caught.value)


def test_only_system_messages_over_the_budget_is_context_too_long() -> None:
    with pytest.raises(ContextTooLong):
        trim([sized("system", 100)], TrimSpec(max_tokens=50), simple_count, Budget(limit=50))


def test_budget_limit_falls_back_to_the_spec_max_tokens() -> None:
    messages = [sized("user", 100), sized("user", 100)]
    d = trim(messages, TrimSpec(max_tokens=150), simple_count, Budget(limit=None))
    assert d.budget == 150 and d.kept == (1,)


@pytest.mark.parametrize(
    ("spec", "window", "reserve", "expected"),
    [
        (TrimSpec(max_tokens=6000), None, 0, 6000),
        (TrimSpec(max_tokens=6000), 128_000, 1000, 6000),
        (TrimSpec(context_fraction=0.75), 128_000, 4000, 92_000),
        (TrimSpec(max_tokens=6000, context_fraction=0.75), 4000, 500, 2500),
        (TrimSpec(max_tokens=6000, context_fraction=0.75), 8000, 8000, 0),
        (TrimSpec(max_tokens=6000, context_fraction=0.75), 128_000, 0, 6000),
        (TrimSpec(max_tokens=6000, context_fraction=0.75), None, 0, 6000),
        (TrimSpec(context_fraction=0.75), None, 100, None),
        (TrimSpec(max_turns=3), 128_000, 100, None),
        (TrimSpec(max_tokens=100), None, 500, 100),
    ],
)
def test_budget_limit_takes_the_stricter_limit_and_reserves_the_answer_from_the_window(
    spec: TrimSpec, window: int | None, reserve: int, expected: int | None
) -> None:
    assert budget_limit(spec, window, reserve) == expected


def test_clipping_keeps_head_and_tail_with_a_marker_and_fits() -> None:
    text = "HEAD" + "".join(f"line {i}\n" for i in range(800)) + "TAIL"
    message = {"role": "tool", "tool_call_id": "a", "name": "search", "content": text}
    clipped = clip_tool_result(message, 100, simple_count)
    assert clipped is not None
    new, tokens = clipped
    assert new is not message and message["content"] == text  # a copy; the input is untouched
    assert {k: v for k, v in new.items() if k != "content"} == {
        k: v for k, v in message.items() if k != "content"
    }
    head, _, tail = new["content"].partition("\n[... ctxproxy clipped ")
    assert text.startswith(head) and head.startswith("HEAD") and len(head) > 100
    assert tail.endswith("TAIL") and text.endswith(tail.split(" ...]\n", 1)[1])
    before = simple_count(message)
    assert tokens == simple_count(new) <= 100 and tokens > 90  # close to the cap, not far below
    assert f"clipped {before - tokens} tokens" in new["content"]


def test_clipping_a_list_of_parts_shortens_only_the_text() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://x/i.png"}}
    parts = [{"type": "text", "text": "A" * 2000}, image, {"type": "text", "text": "B" * 2000}]
    message = {"role": "tool", "tool_call_id": "a", "content": parts}
    clipped = clip_tool_result(message, 200, simple_count)
    assert clipped is not None
    content = clipped[0]["content"]
    assert content[1] is image and len(content) == 3
    assert content[0]["text"].startswith("AAA") and "ctxproxy clipped" in content[0]["text"]
    assert set(content[2]["text"]) == {"B"} and clipped[1] <= 200


def test_clipping_returns_none_when_there_is_nothing_to_gain() -> None:
    small = {"role": "tool", "tool_call_id": "a", "content": "tiny"}
    assert clip_tool_result(small, 100, simple_count) is None
    assert clip_tool_result({"role": "tool", "content": None}, 1, simple_count) is None
    assert MARKER.format(tokens=5) == "\n[... ctxproxy clipped 5 tokens of tool output ...]\n"


def test_oversize_results_are_clipped_in_older_turns_but_not_in_the_newest() -> None:
    messages = [user(), calls("a"), sized("tool", 500, tool_call_id="a"), say()]
    messages += [user(), calls("b"), sized("tool", 500, tool_call_id="b")]
    d = run(messages, TrimSpec(tool_output_max_tokens=100))
    assert [c.index for c in d.clipped] == [2]
    assert d.clipped[0].tokens_before == 500 and d.clipped[0].tokens_after <= 100
    assert d.messages[-1] is messages[-1] and d.dropped == () and d.reason is None


def test_the_newest_turn_is_clipped_only_when_the_budget_needs_it() -> None:
    messages = [user("old"), say(), user(), calls("a", "b")]
    messages += [sized("tool", 300, tool_call_id="a"), sized("tool", 400, tool_call_id="b")]
    spec = TrimSpec(max_tokens=600, tool_output_max_tokens=100)
    d = run(messages, spec)
    # Older turn dropped; the larger result clipped first and that was enough.
    assert d.kept == (2, 3, 4, 5) and [c.index for c in d.clipped] == [5]
    roomy = run(messages, TrimSpec(max_tokens=800, tool_output_max_tokens=100))
    assert roomy.clipped == () and roomy.dropped == ()


def test_a_result_that_cannot_shrink_to_the_cap_makes_trim_drop_its_turn() -> None:
    # The marker alone is over a 5-token cap: the older result is clipped to the
    # marker but still costs more than the replay's estimate, so its turn goes.
    messages = [user("old"), calls("a"), sized("tool", 200, tool_call_id="a"), user("new")]
    estimate = sum(map(simple_count, messages)) - 200 + 5
    d = run(messages, TrimSpec(max_tokens=estimate, tool_output_max_tokens=5))
    assert d.kept == (3,) and d.reason == "max_tokens"


def test_low_water_cuts_deeper_then_keeps_the_prefix_for_several_turns() -> None:
    turns = [[sized("user", 50), sized("assistant", 50)] for _ in range(12)]

    def first_kept_turn(spec: TrimSpec, grown: int) -> int:
        messages = [m for turn in turns[:grown] for m in turn]
        return run(messages, spec).turns_dropped

    hysteresis = [first_kept_turn(TrimSpec(max_tokens=500, low_water=0.6), t) for t in range(1, 13)]
    assert hysteresis == [0, 0, 0, 0, 0, 2, 2, 4, 4, 6, 6, 8]
    minimal = [first_kept_turn(TrimSpec(max_tokens=500), t) for t in range(1, 13)]
    assert minimal == [0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7]


def test_low_water_keeps_the_cut_while_the_newest_turn_grows_piece_by_piece() -> None:
    # Two 150-token turns, then a turn sent first as its user message (50), then
    # again with the answer (100). The first request cuts to turn 1 (150 + 50 is
    # within 70% of 300); the second must keep that cut: 150 + 100 still fits.
    older = [sized("user", 75), sized("assistant", 75), sized("user", 75), sized("assistant", 75)]
    spec = TrimSpec(max_tokens=300, low_water=0.7)
    asked = run([*older, sized("user", 50)], spec)
    answered = run([*older, sized("user", 50), sized("assistant", 50)], spec)
    assert asked.kept[0] == answered.kept[0] == 2


def test_passthrough_keeps_everything_and_counts_it() -> None:
    messages = [sys(), user(), result("orphan"), calls("x")]
    d = apply(messages, NoneSpec(), simple_count, Budget(limit=1, fixed=7))
    assert d.messages == messages and all(a is b for a, b in zip(d.messages, messages, strict=True))
    assert d.kept == (0, 1, 2, 3) and d.dropped == () and d.repaired == ()
    assert d.tokens_before == d.tokens_after == sum(map(simple_count, messages)) + 7
    assert not d.changed


def test_apply_dispatches_trim_specs_to_trim() -> None:
    d = apply(tool_turns(4), TrimSpec(max_turns=1), simple_count, Budget())
    assert d.turns_dropped == 3


def test_every_content_shape_passes_through_unaltered_and_is_counted() -> None:
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}]
    refusal = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    messages = [user(), {"role": "user", "content": parts}, refusal, calls("a"), result("a")]
    d = run(messages, TrimSpec(max_tokens=10_000))
    assert all(a is b for a, b in zip(d.messages, messages, strict=True))
    assert d.tokens_after == sum(map(simple_count, messages))


def _replay_step_by_step(sim: list[int], raw: list[int], room: int, low_room: float) -> int:
    """The hysteresis replay as the module docstring states it, one step at a time."""
    prefix = [0, *accumulate(sim)]
    cut = 0
    for t in range(1, len(sim) + 1):
        newest = raw[t - 1]
        older = prefix[t - 1] - prefix[cut]
        if older + newest > room:
            while cut < t - 1 and (older > low_room or older + newest > room):
                cut += 1
                older = prefix[t - 1] - prefix[cut]
    return cut


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=40),
    st.integers(-20, 300),
    st.floats(0.0, 1.0),
)
def test_the_replay_cuts_where_stepping_unit_by_unit_would(units, room, water):
    """The replay compares once per unit between crossings; the cut is the same."""
    raw = [max(a, b) for a, b in units]
    sim = [min(a, b) for a, b in units]  # a clipped unit costs at most as is
    assert trim_module._hysteresis_cut(sim, raw, room, water * room - 5) == _replay_step_by_step(
        sim, raw, room, water * room - 5
    )
