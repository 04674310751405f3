"""Every trimming rule, checked over generated conversations.

``assert_obeys_rules`` is the oracle the other policy tests share: it checks a
Decision against the input with code of its own (turns and tool pairing are
recomputed here, not borrowed from policies/), so a bug in policies/units.py
cannot hide itself.

Why the hysteresis property holds (the cut the replay in policies/trim.py
computes): a later request extends an earlier one, so every unit but the
earlier's newest is identical and that one only grew. With a cost per message
that does not depend on its place (no clipping), costs only grow, so the
later replay crosses the budget wherever the earlier did, and the cut it lands
on, the first where the *older* units fit the low-water mark and everything
fits the limit, is never before the earlier cut; and when the suffix from the
earlier cut fits, the earlier cut satisfies both conditions, so it is the
landing point and no later step crosses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.apply import apply
from policies.trim import budget_limit, clip_tool_result, trim
from policies.types import Budget, ContextTooLong, Decision, Message, TrimSpec

SYSTEM = ("system", "developer")


def simple_count(message: Message) -> int:
    """A deterministic stand-in for a tokenizer: 3 per message, 1 per 4 characters."""
    content = message.get("content")
    tokens = 3 + (len(str(content)) // 4 if content is not None else 0)
    for call in message.get("tool_calls") or []:
        tokens += 3 + len(str(call.get("function"))) // 4
    if message.get("function_call"):
        tokens += 3 + len(str(message["function_call"])) // 4
    if isinstance(message.get("refusal"), str):
        tokens += len(message["refusal"]) // 4
    return tokens


# The oracle.


def unpaired(messages: Sequence[Message]) -> set[int]:
    """Indexes an API would reject: calls without all their results, results without a call."""
    bad: set[int] = set()
    answered_by: dict[int, int] = {}  # tool index -> the call message it answers
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if not calls:
            continue
        ids = [c.get("id") for c in calls]
        seen: dict[Any, int] = {}
        for j in range(i + 1, len(messages)):
            role = messages[j].get("role")
            if role == "tool":
                tid = messages[j].get("tool_call_id")
                if tid in ids and tid not in seen:
                    seen[tid] = j
            elif role not in SYSTEM:
                break
        if set(seen) == set(ids) and None not in ids:
            answered_by.update(dict.fromkeys(seen.values(), i))
        else:
            bad.add(i)
    bad.update(
        i for i, m in enumerate(messages) if m.get("role") == "tool" and i not in answered_by
    )
    return bad


def units_of(messages: Sequence[Message], skip: set[int]) -> list[list[int]]:
    """Droppable units, oldest first, without system messages and ``skip``."""
    units: list[list[int]] = [[]]
    for i, m in enumerate(messages):
        if m.get("role") == "user":
            units.append([])
        if m.get("role") not in SYSTEM and i not in skip:
            units[-1].append(i)
    return [u for u in units if u]


def system_tokens(messages: Sequence[Message], count: Any) -> int:
    return sum(count(m) for m in messages if m.get("role") in SYSTEM)


def newest_needed(
    messages: Sequence[Message], spec: TrimSpec, count: Any, fixed: int, orphans: set[int]
) -> int:
    """System messages plus the newest unit, every oversize tool result in it clipped."""
    units = units_of(messages, orphans)
    total = fixed + system_tokens(messages, count)
    cap = spec.tool_output_max_tokens
    for i in units[-1] if units else []:
        c = count(messages[i])
        if cap is not None and messages[i].get("role") == "tool" and c > cap:
            clipped = clip_tool_result(messages[i], cap, count, c)
            c = clipped[1] if clipped else c
        total += c
    return total


def assert_obeys_rules(
    messages: Sequence[Message], spec: TrimSpec, count: Any, budget: Budget, d: Decision
) -> None:
    n = len(messages)
    limit = budget.limit if budget.limit is not None else spec.max_tokens
    cap = spec.tool_output_max_tokens
    kept, dropped = list(d.kept), list(d.dropped)
    # Every input index is kept or dropped, once, in order.
    assert kept == sorted(kept) and dropped == sorted(dropped)
    assert sorted(kept + dropped) == list(range(n))
    orphans = unpaired(messages)
    assert set(d.repaired) == orphans and orphans <= set(dropped)
    # Forwarded messages are the input objects, except clipped tool results.
    clipped = {c.index: c for c in d.clipped}
    assert set(clipped) <= set(kept) and len(d.messages) == len(kept)
    for out, i in zip(d.messages, kept, strict=True):
        if i in clipped:
            original = messages[i]
            assert out is not original and original.get("role") == "tool"
            assert {k: v for k, v in out.items() if k != "content"} == {
                k: v for k, v in original.items() if k != "content"
            }
            assert "ctxproxy clipped" in str(out["content"])
            assert cap is not None and clipped[i].tokens_before == count(original) > cap
            assert clipped[i].tokens_after == count(out) < clipped[i].tokens_before
        else:
            assert out is messages[i]
    # System and developer messages all kept (same objects, checked above).
    assert {i for i, m in enumerate(messages) if m.get("role") in SYSTEM} <= set(kept)
    assert not unpaired(d.messages)
    # Whole units, oldest dropped first, the newest never.
    units = units_of(messages, orphans)
    kept_units = [all(i in kept for i in u) for u in units]
    assert all(k or all(i in dropped for i in u) for k, u in zip(kept_units, units, strict=True))
    assert kept_units == sorted(kept_units)  # False..., then True...
    if units:
        assert kept_units[-1]
    assert d.turns_dropped == kept_units.count(False)
    if spec.max_turns is not None:
        assert kept_units.count(True) <= max(1, spec.max_turns)
        if limit is None:
            assert kept_units.count(True) == min(len(units), max(1, spec.max_turns))
    # Token accounting and the budget.
    forwarded = sum(count(m) for m in d.messages) + budget.fixed
    assert d.tokens_before == sum(count(m) for m in messages) + budget.fixed
    assert d.tokens_after == forwarded
    assert d.budget == limit
    if limit is not None:
        assert forwarded <= limit
    # Clipping: every oversize result in older kept units; the newest only if needed.
    newest = set(units[-1]) if units else set()
    for i in kept:
        m = messages[i]
        if cap is None or m.get("role") != "tool" or count(m) <= cap:
            assert i not in clipped
        elif i not in newest:
            # Unclipped only when clipping cannot shrink it (the marker is no smaller).
            assert i in clipped or clip_tool_result(m, cap, count) is None
    if newest & set(clipped):
        assert limit is not None and d.turns_dropped == len(units) - 1
        raw_newest = sum(count(messages[i]) for i in newest)
        assert system_tokens(messages, count) + raw_newest + budget.fixed > limit
    # Without low_water or max_turns, the cut is minimal: with one more unit the
    # request would not fit, measured as the replay measures (an oversize result
    # in an older unit at the cap) or as it really is once clipped.
    minimal = spec.low_water is None and spec.max_turns is None and not newest & set(clipped)
    if limit is not None and minimal and d.turns_dropped:
        with_one_more = units[d.turns_dropped - 1 :]
        estimated = really = budget.fixed + system_tokens(messages, count)
        for u in with_one_more:
            older = u is not with_one_more[-1]
            for i in u:
                c = count(messages[i])
                estimated += c
                really += c
                if older and cap is not None and c > cap and messages[i].get("role") == "tool":
                    estimated += cap - c
                    clip = clip_tool_result(messages[i], cap, count, c)
                    really += clip[1] - c if clip else 0
        assert estimated > limit or really > limit
    # The reason names a cause that applied.
    if not d.turns_dropped and not orphans:
        assert d.reason is None
    elif not d.turns_dropped:
        assert d.reason == "orphan"
    else:
        assert d.reason in ("max_turns", "max_tokens", "orphan")
        if d.reason == "max_turns":
            assert spec.max_turns is not None


def run_and_check(
    messages: Sequence[Message], spec: TrimSpec, count: Any, budget: Budget
) -> Decision | None:
    """Trim and check every rule; on ContextTooLong check that it was impossible."""
    try:
        d = apply(messages, spec, count, budget)
    except ContextTooLong as exc:
        limit = budget.limit if budget.limit is not None else spec.max_tokens
        assert limit is not None and exc.budget == limit
        needed = newest_needed(messages, spec, count, budget.fixed, unpaired(messages))
        assert exc.needed == needed > limit
        return None
    assert_obeys_rules(messages, spec, count, budget, d)
    return d


# Generated conversations.


def _text(label: str, size: int) -> str:
    return (label + " " + "lorem ipsum dolor " * (size // 18 + 1))[:size]


@st.composite
def conversations(draw: st.DrawFn, broken: bool = True, system_anywhere: bool = True) -> list:
    ids = iter(range(10**6))
    sizes = st.integers(0, 400)
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": _text("sys", draw(sizes))})
    # Weighted by repetition: mostly well-formed turns, some broken pairs.
    kinds = ["user"] * 4 + ["assistant"] * 2 + ["tools"] * 4 + ["function", "system", "leading"]
    if broken:
        kinds += ["orphan_result", "missing_result", "duplicate_result"]
    if not system_anywhere:
        kinds.remove("system")
    for kind in draw(st.lists(st.sampled_from(kinds), max_size=30)):
        if kind == "leading" and not out:
            out.append({"role": "assistant", "content": "Hello! How can I help?"})
        elif kind == "system":
            role = draw(st.sampled_from(SYSTEM))
            out.append({"role": role, "content": _text(role, draw(st.integers(0, 60)))})
        elif kind == "user":
            shape = draw(st.sampled_from(["str", "parts"]))
            text = _text("user", draw(sizes))
            if shape == "str":
                out.append({"role": "user", "content": text})
            else:
                image = {"type": "image_url", "image_url": {"url": "https://x/i.png"}}
                out.append({"role": "user", "content": [{"type": "text", "text": text}, image]})
        elif kind == "assistant":
            shape = draw(st.sampled_from(["str", "parts", "refusal"]))
            text = _text("assistant", draw(sizes))
            if shape == "str":
                out.append({"role": "assistant", "content": text})
            elif shape == "parts":
                out.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
            else:
                out.append({"role": "assistant", "content": None, "refusal": text})
        elif kind == "function":
            call = {"name": "lookup", "arguments": '{"q": 1}'}
            out.append({"role": "assistant", "content": None, "function_call": call})
            out.append({"role": "function", "name": "lookup", "content": _text("fn", 40)})
        else:
            k = draw(st.integers(1, 3))
            call_ids = [f"call_{next(ids)}" for _ in range(k)]
            calls = [
                {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}}
                for c in call_ids
            ]
            content = draw(st.sampled_from([None, "Let me check."]))
            out.append({"role": "assistant", "content": content, "tool_calls": calls})
            results = draw(st.permutations(call_ids))
            if kind == "missing_result":
                results = results[1:]
            if kind == "duplicate_result":
                results = [*results, results[0]]
            for j, cid in enumerate(results):
                if j == 1 and system_anywhere and draw(st.booleans()):
                    out.append({"role": "system", "content": "mid-call note"})
                size = draw(st.integers(0, 3000))
                body: Any = _text("result", size)
                if draw(st.integers(0, 4)) == 0:
                    body = [{"type": "text", "text": body}, {"type": "text", "text": "tail"}]
                out.append({"role": "tool", "tool_call_id": cid, "content": body})
            if kind == "orphan_result":
                out.append({"role": "tool", "tool_call_id": "call_nobody", "content": "lost"})
    return out


specs = st.builds(
    TrimSpec,
    max_turns=st.none() | st.integers(0, 6),
    max_tokens=st.none() | st.integers(0, 4000),
    context_fraction=st.none() | st.floats(0.1, 1.0),
    low_water=st.none() | st.floats(0.3, 1.0),
    tool_output_max_tokens=st.none() | st.integers(5, 400),
)

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(
    conversations(),
    specs,
    st.none() | st.floats(0.15, 1.2),
    st.none() | st.floats(0.2, 3.0),
    st.integers(0, 100),
    st.integers(0, 100),
    st.booleans(),
)
def test_every_trim_result_obeys_the_rules(
    messages: list,
    spec: TrimSpec,
    share: float | None,
    window_share: float | None,
    reserve: int,
    fixed: int,
    caller_budget: bool,
) -> None:
    # Limits drawn as shares of the conversation's size, so that they bind.
    total = sum(map(simple_count, messages)) + fixed
    spec = replace(spec, max_tokens=None if share is None else int(share * total))
    window = None if window_share is None else int(window_share * total)
    # Without a caller's budget, trim falls back to the spec's max_tokens.
    limit = budget_limit(spec, window, reserve) if caller_budget else None
    budget = Budget(limit=limit, fixed=fixed)
    run_and_check(messages, spec, simple_count, budget)


@FAST
@given(conversations(), specs, st.integers(0, 4000))
def test_trim_is_deterministic_and_does_not_touch_its_input(
    messages: list, spec: TrimSpec, limit: int
) -> None:
    snapshot = repr(messages)
    try:
        first = trim(messages, spec, simple_count, Budget(limit=limit))
        second = trim(list(messages), spec, simple_count, Budget(limit=limit))
    except ContextTooLong:
        return
    assert repr(messages) == snapshot
    assert first.kept == second.kept and first.clipped == second.clipped
    assert first.messages == second.messages


@st.composite
def agent_conversations(draw: st.DrawFn) -> list:
    """Well-formed turns as an agent produces them: a user message, tool rounds, an answer."""
    ids = iter(range(10**6))
    sizes = st.integers(10, 800)
    out: list[dict[str, Any]] = [{"role": "system", "content": _text("sys", draw(sizes))}]
    for _ in range(draw(st.integers(1, 12))):
        out.append({"role": "user", "content": _text("user", draw(sizes))})
        for _ in range(draw(st.integers(0, 3))):
            cid = f"call_{next(ids)}"
            call = {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            out.append({"role": "tool", "tool_call_id": cid, "content": _text("r", draw(sizes))})
        out.append({"role": "assistant", "content": _text("answer", draw(sizes))})
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    agent_conversations() | conversations(broken=False, system_anywhere=False),
    st.integers(150, 2000),
    st.floats(0.3, 1.0),
    st.integers(0, 50),
    st.booleans(),
)
def test_low_water_moves_the_cut_only_when_the_kept_suffix_overflows(
    messages: list, limit: int, low_water: float, fixed: int, every_message: bool
) -> None:
    """Grow the conversation request by request (at each user message, or at every
    message as an agent does); the first kept non-system message changes only when
    everything from the previous one on no longer fits."""
    spec = TrimSpec(max_tokens=limit, low_water=low_water)
    budget = Budget(limit=limit, fixed=fixed)
    ends = [i + 1 for i, m in enumerate(messages) if every_message or m.get("role") == "user"]
    previous: int | None = None
    for end in ends:
        request = messages[:end]
        d = run_and_check(request, spec, simple_count, budget)
        if d is None:
            continue
        first = next((i for i in d.kept if request[i].get("role") not in SYSTEM), None)
        if previous is not None and first != previous:
            orphans = unpaired(request)
            suffix = sum(
                simple_count(m)
                for i, m in enumerate(request)
                if m.get("role") in SYSTEM or (i >= previous and i not in orphans)
            )
            assert suffix + fixed > limit, (previous, first, end)
        previous = first


@FAST
@given(conversations(), specs, st.integers(0, 4000), st.integers(0, 50))
def test_counts_given_as_a_list_decide_as_counting_one_by_one(
    messages: list, spec: TrimSpec, limit: int, fixed: int
) -> None:
    """``apply(..., costs)`` (a session's counts, known) is the same decision as asking
    ``count`` for each message, and only clipped copies are counted anew."""
    asked: list[Message] = []

    def count(message: Message) -> int:
        asked.append(message)
        return simple_count(message)

    budget = Budget(limit=limit, fixed=fixed)
    costs = [simple_count(m) for m in messages]
    try:
        expected = apply(messages, spec, simple_count, budget)
    except ContextTooLong:
        with pytest.raises(ContextTooLong):
            apply(messages, spec, count, budget, costs)
        return
    got = apply(messages, spec, count, budget, costs)
    assert (got.kept, got.clipped, got.tokens_before, got.tokens_after) == (
        expected.kept,
        expected.clipped,
        expected.tokens_before,
        expected.tokens_after,
    )
    assert got.messages == expected.messages
    assert not any(any(a is m for m in messages) for a in asked)
