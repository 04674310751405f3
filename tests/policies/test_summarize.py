"""policies/summarize.py: which turns are kept, which are summarized, and where the summary goes."""

from __future__ import annotations

from typing import Any

import pytest

from policies.apply import apply
from policies.summarize import allowance, assemble, fallback, plan, prefetch
from policies.transcript import PAIR_REQUEST, SUMMARY_HEADER
from policies.trim import trim
from policies.types import (
    Budget,
    ContextTooLong,
    SummarizerSpec,
    SummarizeSpec,
    SummaryState,
    TrimSpec,
)
from tests.policies.test_properties import (
    simple_count,
    unpaired,
)

count = simple_count
SYSTEM = {"role": "system", "content": "You are a support agent."}


def turns(n: int, start: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in range(start, start + n):
        out += [
            {"role": "user", "content": f"question {t} about order #{1000 + t}"},
            {"role": "assistant", "content": f"answer {t}"},
        ]
    return out


def spec(**over: Any) -> SummarizeSpec:
    return SummarizeSpec(**{"trigger_turns": 4, "keep_last_turns": 2, **over})


def conversation(n: int) -> list[dict[str, Any]]:
    """The system message, n answered turns, and a new question."""
    return [SYSTEM, *turns(n), {"role": "user", "content": "new question"}]


def test_a_history_within_the_trigger_is_forwarded_as_it_came():
    messages = conversation(3)  # four turns, the trigger allows four
    planned = plan(messages, spec(), count, Budget())
    assert planned.task is None and planned.decision is not None
    assert planned.decision.messages == messages
    assert not planned.decision.changed


def test_past_the_trigger_everything_but_the_last_turns_is_to_be_summarized():
    messages = conversation(5)
    planned = plan(messages, spec(), count, Budget())
    task = planned.task
    assert planned.decision is None and task is not None
    assert (task.start_unit, task.cut_unit) == (0, 4)
    assert (task.start, task.end) == (1, 9)  # "question 0" up to "question 4"
    assert task.source == tuple(range(1, 9)) and task.previous is None
    assert [f.value for f in task.facts] == [f"order #{1000 + t}" for t in range(4)]
    # Should the summarizer fail: trimming to the trigger's turns.
    assert planned.fallback == trim(messages, TrimSpec(max_turns=4), count, Budget())


def test_the_summary_goes_after_the_leading_system_messages_and_replaces_its_turns():
    messages = [SYSTEM, {"role": "developer", "content": "dev"}, *conversation(5)[1:]]
    messages.insert(5, {"role": "system", "content": "a note mid-way"})
    task = plan(messages, spec(), count, Budget()).task
    assert task is not None
    d = assemble(messages, spec(), count, Budget(), task.state("they talked"))
    assert d.messages[:2] == messages[:2]
    assert d.messages[2]["role"] == "system"
    assert d.messages[2]["content"].startswith(f"{SUMMARY_HEADER}\nthey talked")
    assert "order #1000" in d.messages[2]["content"]  # pinned facts
    # The mid-way system message stays, after the summary; then the kept turns.
    assert d.messages[3] is messages[5]
    assert d.messages[4:] == messages[-3:]
    assert all(a is b for a, b in zip(d.messages[4:], messages[-3:], strict=True))
    assert d.reason == "summarized" and d.turns_dropped == 4
    assert d.extra["summary"]["units"] == 4 and d.extra["summary_tokens"] > 0
    assert set(d.dropped) == set(range(len(messages))) - set(d.kept)
    assert not set(d.dropped) & {0, 1, 5}


def test_a_stored_summary_is_reused_while_the_view_stays_within_the_trigger():
    messages = conversation(5)
    task = plan(messages, spec(), count, Budget()).task
    assert task is not None
    state = task.state("they talked", id=7)
    made = assemble(messages, spec(), count, Budget(), state)
    longer = [*messages, {"role": "assistant", "content": "ok"}, *turns(1, 9)[:1]]
    planned = plan(longer, spec(), count, Budget(), [state])
    assert planned.reused == state and planned.task is None
    assert planned.decision is not None
    assert planned.decision.messages[: len(made.messages) - 1] == made.messages[:-1]


def test_the_next_summary_extends_the_stored_one_with_only_the_new_turns():
    messages = conversation(5)
    task = plan(messages, spec(), count, Budget()).task
    assert task is not None
    state = task.state("they talked", id=7)
    longer = [*messages, {"role": "assistant", "content": "ok"}, *turns(3, 20)]
    longer.append({"role": "user", "content": "and now?"})
    planned = plan(longer, spec(), count, Budget(), [state])
    again = planned.task
    assert again is not None and again.previous == state
    assert again.source[0] == state.covers  # nothing before it is sent again
    assert again.start == task.start and again.cut_unit == 9 - 2 + 1
    # The previous facts are carried, the new ones added.
    assert {f.value for f in task.facts} < {f.value for f in again.facts}


@pytest.mark.parametrize(
    "state",
    [
        SummaryState(covers=9, start_unit=1, text="another start"),
        SummaryState(covers=8, start_unit=0, text="not a turn boundary"),
        SummaryState(covers=13, start_unit=0, text="covers the newest turn"),
        SummaryState(covers=11, start_unit=0, text="leaves one turn, not two"),
    ],
)
def test_a_stored_summary_that_does_not_fit_this_conversation_is_not_used(state):
    planned = plan(conversation(5), spec(), count, Budget(), [state])
    assert planned.reused is None and planned.task is not None
    assert planned.task.previous is None


def test_the_longest_usable_stored_summary_wins():
    messages = conversation(5)
    short = SummaryState(covers=3, start_unit=0, text="short")
    long = SummaryState(covers=7, start_unit=0, text="long")
    planned = plan(messages, spec(), count, Budget(), [short, long])
    assert planned.reused == long and planned.task is None
    # When the longest no longer suffices, the next summary extends it.
    planned = plan(conversation(7), spec(), count, Budget(), [short, long])
    assert planned.task is not None and planned.task.previous == long


def test_a_token_trigger_cuts_until_the_kept_turns_fit_the_low_water_mark():
    messages = conversation(60)
    assert sum(map(count, messages)) > 800
    s = SummarizeSpec(trigger_tokens=400, keep_last_turns=1, summary_share=0.1)
    planned = plan(messages, s, count, Budget())
    task = planned.task
    assert task is not None
    d = assemble(messages, s, count, Budget(), task.state("x"))
    total, _, _ = allowance(s, 400)
    kept = sum(count(m) for m in d.messages) - count(d.messages[1])
    assert kept + total <= 0.7 * 400
    assert d.tokens_after <= 400
    # One unit more would not have fit.
    assert task.cut_unit > 1


def test_keep_first_turns_keeps_the_opening_and_summarizes_the_middle():
    messages = conversation(6)
    s = spec(trigger_turns=5, keep_first_turns=1)
    task = plan(messages, s, count, Budget()).task
    assert task is not None and task.start_unit == 1
    d = assemble(messages, s, count, Budget(), task.state("middle"))
    assert d.messages[:3] == messages[:3]  # system, the first question and answer
    assert d.messages[3]["content"].startswith(SUMMARY_HEADER)
    assert d.messages[4:] == messages[-3:]
    assert "order #1000" not in d.messages[3]["content"]  # turn 0 is not summarized


def test_pair_placement_is_a_question_and_the_summary_as_its_answer():
    messages = conversation(5)
    s = spec(placement="pair")
    task = plan(messages, s, count, Budget()).task
    assert task is not None
    d = assemble(messages, s, count, Budget(), task.state("they talked"))
    assert d.messages[0] is SYSTEM
    assert d.messages[1] == {"role": "user", "content": PAIR_REQUEST}
    assert d.messages[2]["role"] == "assistant"
    assert d.messages[3:] == messages[-3:]


def test_a_view_over_the_budget_clips_then_drops_kept_turns_but_never_the_summary():
    big = {"role": "tool", "tool_call_id": "c1", "content": "x" * 4000}
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    messages = [*conversation(5)[:-1], {"role": "user", "content": "look"}, call, big]
    messages += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "ok?"}]
    s = spec(max_tokens=300, tool_output_max_tokens=50, trigger_turns=8, keep_last_turns=2)
    planned = plan(messages, s, count, Budget())
    state = planned.task.state("s") if planned.task else None
    d = assemble(messages, s, count, Budget(), state) if state else planned.decision
    assert d is not None
    assert d.tokens_after <= 300
    assert any(
        m.get("content", "").startswith(SUMMARY_HEADER) for m in d.messages if m["role"] == "system"
    )
    assert not unpaired(d.messages)


def test_a_newest_turn_over_the_budget_cannot_be_served():
    messages = [SYSTEM, {"role": "user", "content": "word " * 2000}]
    with pytest.raises(ContextTooLong):
        plan(messages, spec(max_tokens=100), count, Budget())


def test_orphans_are_repaired_and_never_forwarded():
    messages = conversation(2)
    messages.insert(2, {"role": "tool", "tool_call_id": "ghost", "content": "lost"})
    d = plan(messages, spec(), count, Budget()).decision
    assert d is not None and d.repaired == (2,)
    assert messages[2] not in d.messages


def test_the_fallback_is_trimming_with_the_trigger_and_the_budget():
    messages = conversation(9)
    s = spec(trigger_tokens=500, max_tokens=600)
    assert fallback(messages, s, count, Budget(fixed=3)) == trim(
        messages, TrimSpec(max_turns=4, max_tokens=600), count, Budget(limit=600, fixed=3)
    )


def test_prefetch_names_the_summary_the_next_request_will_need():
    history = [*conversation(3), {"role": "assistant", "content": "reply"}]
    # Four turns now; the next question makes five, past the trigger.
    task = prefetch(history, spec(), count, Budget())
    assert task is not None and task.cut_unit == 5 - 2
    nxt = [*history, {"role": "user", "content": "next"}]
    planned = plan(nxt, spec(), count, Budget(), [task.state("ahead")])
    assert planned.reused is not None and planned.task is None
    assert prefetch(history, spec(prefetch=False), count, Budget()) is None
    assert prefetch(conversation(1), spec(), count, Budget()) is None


def test_the_summary_share_bounds_the_summarizer_answer():
    s = SummarizeSpec(
        trigger_turns=5,
        max_tokens=2500,
        summary_share=0.1,
        summarizer=SummarizerSpec(max_tokens=400),
    )
    total, answer, facts = allowance(s, 2500)
    assert total == 250 and answer + facts <= total and answer < 400


def test_apply_without_a_store_falls_back_when_a_summary_is_needed():
    d = apply(conversation(5), spec(), count, Budget())
    assert d.extra["summary_needed"] is True and d.reason == "max_turns"
    assert "summary_needed" not in apply(conversation(1), spec(), count, Budget()).extra
