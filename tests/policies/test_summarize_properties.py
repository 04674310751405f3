"""policies/summarize.py over generated conversations: the rules every summarized view keeps."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.summarize import assemble, plan, prefetch
from policies.transcript import PAIR_REQUEST, SUMMARY_HEADER
from policies.trim import trim
from policies.types import Budget, ContextTooLong, Message, SummarizeSpec, TrimSpec
from tests.policies.test_properties import (
    assert_obeys_rules,
    conversations,
    simple_count,
    units_of,
    unpaired,
)

count = simple_count

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

specs = st.builds(
    lambda trigger, keep, first, placement, tokens: SummarizeSpec(
        trigger_turns=trigger,
        keep_last_turns=min(keep, trigger - first) if trigger > first else 1,
        keep_first_turns=first if trigger > first else 0,
        placement=placement,
        trigger_tokens=tokens,
    ),
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(0, 1),
    st.sampled_from(["system", "pair"]),
    st.none() | st.integers(800, 6000),
)


def summary_indexes(d_messages: Sequence[Message], messages: Sequence[Message]) -> list[int]:
    ids = {id(m) for m in messages}
    return [j for j, m in enumerate(d_messages) if id(m) not in ids and m.get("role") != "tool"]


@FAST
@given(conversations(broken=False), specs)
def test_every_summarized_view_keeps_the_rules(messages: list, s: SummarizeSpec) -> None:
    try:
        planned = plan(messages, s, count, Budget())
    except ContextTooLong:
        return
    if planned.task is None:
        d = planned.decision
        assert d is not None
        return
    task = planned.task
    # The fallback is trimming, under the trigger's turns and the budget.
    limit = s.max_tokens if s.max_tokens is not None else s.trigger_tokens
    trim_spec = TrimSpec(max_turns=s.trigger_turns, max_tokens=limit)
    assert planned.fallback == trim(messages, trim_spec, count, Budget(limit))
    assert planned.fallback is not None
    assert_obeys_rules(messages, trim_spec, count, Budget(limit), planned.fallback)
    state = task.state("SUMMARY")
    try:
        d = assemble(messages, s, count, Budget(), state)
    except ContextTooLong:
        return
    # System and developer messages: every one, the very same objects, in order.
    system = [m for m in messages if m.get("role") in ("system", "developer")]
    forwarded_system = [m for m in d.messages if any(m is x for x in system)]
    assert forwarded_system == system and all(
        a is b for a, b in zip(forwarded_system, system, strict=True)
    )
    # Tool calls and results stay paired.
    assert not unpaired(d.messages)
    # The kept turns are verbatim, whole, and the newest ones.
    units = units_of(messages, set())
    kept_units = [u for u in units if all(i in d.kept for i in u)]
    assert all(all(i in d.dropped for i in u) for u in units if u not in kept_units)
    assert units[-1] in kept_units
    if s.trigger_tokens is None and s.keep_last_turns is not None:
        assert all(u in kept_units for u in units[-s.keep_last_turns :])
    originals = [m for m in d.messages if any(m is x for x in messages)]
    assert len(originals) == len(d.kept)
    # The summary sits where the summarized turns were: after the first kept units
    # and the system messages before them, in one place.
    synthetic = summary_indexes(d.messages, messages)
    if s.placement == "system":
        assert len(synthetic) == 1 and d.messages[synthetic[0]]["role"] == "system"
    else:
        assert len(synthetic) == 2 and d.messages[synthetic[0]]["content"] == PAIR_REQUEST
        assert synthetic[1] == synthetic[0] + 1
    first_summarized = task.start
    before = [m for i, m in enumerate(messages) if i < first_summarized and i in d.kept]
    assert d.messages[: synthetic[0]] == before
    assert d.messages[synthetic[-1]]["content"].startswith(SUMMARY_HEADER)
    # Reusing the summary on the same request forwards the same view.
    again = plan(messages, s, count, Budget(), [state])
    if again.reused is not None:
        assert again.decision == d


@FAST
@given(conversations(broken=False), specs, st.integers(1, 4))
def test_a_later_summary_costs_only_what_is_new(
    messages: list, s: SummarizeSpec, more: int
) -> None:
    s = dataclasses.replace(s, trigger_tokens=None)
    try:
        planned = plan(messages, s, count, Budget())
    except ContextTooLong:
        return
    if planned.task is None:
        return
    state = planned.task.state("S1")
    longer = [*messages, {"role": "assistant", "content": "ok"}]
    for t in range(more):
        longer += [{"role": "user", "content": f"more {t}"}, {"role": "assistant", "content": "k"}]
    longer.append({"role": "user", "content": "last"})
    later = plan(longer, s, count, Budget(), [state])
    if later.task is not None:
        assert later.task.previous == state
        assert min(later.task.source) >= state.covers
    else:
        assert later.reused == state


@FAST
@given(
    conversations(broken=False),
    specs,
    st.integers(200, 3000),
    st.none() | st.integers(20, 300),
)
def test_a_view_always_fits_the_budget_with_the_summary_and_pairs_intact(
    messages: list, s: SummarizeSpec, budget: int, cap: int | None
) -> None:
    s = dataclasses.replace(s, max_tokens=budget, tool_output_max_tokens=cap, summary_share=0.2)
    try:
        planned = plan(messages, s, count, Budget(fixed=3))
        if planned.task is None:
            d = planned.decision
        else:
            d = assemble(messages, s, count, Budget(fixed=3), planned.task.state("S " * 20))
    except ContextTooLong:
        return
    assert d is not None
    assert d.tokens_after == sum(map(count, d.messages)) + 3 <= budget
    assert not unpaired(d.messages)
    system = [m for m in messages if m.get("role") in ("system", "developer")]
    assert [m for m in d.messages if any(m is x for x in system)] == system
    if planned.task is not None:
        assert any(SUMMARY_HEADER in str(m.get("content")) for m in d.messages)
    # The newest turn is always there, whole (its tool results possibly clipped).
    newest = units_of(messages, set())[-1] if units_of(messages, set()) else []
    assert all(i in d.kept for i in newest)


@FAST
@given(conversations(broken=False), specs, st.integers(200, 3000))
def test_the_callers_token_counts_plan_and_prefetch_as_counting_does(
    messages: list, s: SummarizeSpec, limit: int
) -> None:
    sizes = [count(m) for m in messages]
    budget = Budget(limit=limit, fixed=3)
    try:
        counted = plan(messages, s, count, budget)
    except ContextTooLong:
        return
    given_sizes = plan(messages, s, count, budget, sizes=sizes)
    assert given_sizes == counted
    state = counted.task.state("S1") if counted.task is not None else None
    states = [state] if state is not None else []
    if state is not None:
        try:
            made = assemble(messages, s, count, budget, state)
        except ContextTooLong:  # the summary does not fit this budget: nothing to compare
            made = None
        if made is not None:
            assert assemble(messages, s, count, budget, state, sizes) == made
    history = [*messages, {"role": "assistant", "content": "ok"}]
    expected = prefetch(history, s, count, budget, states)
    assert prefetch(history, s, count, budget, states, [*sizes, count(history[-1])]) == expected
