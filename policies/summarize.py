"""`strategy: summarize`: older turns folded into a stored summary, the newest kept verbatim.

Units are trimming's (:mod:`policies.units`): tool calls never leave their
turn, orphans are dropped as repairs, system and developer messages are
never dropped nor altered. A summary covers the units ``[start_unit, cut)``
(``start_unit`` is ``keep_first_turns``). The view forwarded is the first
units, the summary (a system message, or a user/assistant pair) where the
summarized turns were, every system message, then the units from ``cut``.

Given the stored summaries covering a prefix of the conversation (states),
:func:`plan` decides: within the trigger, forward as is; a stored summary
leaving the view within the trigger, reuse it; else make a new one up to a
new cut (the newest ``keep_last_turns`` verbatim; with a token limit, the
kept turns within ``low_water`` of it). A stored summary covering a prefix
of that range makes the task incremental: it plus only the newer units.
A view over the budget is trimmed as :func:`policies.trim.trim` trims (the
summary pinned); :func:`fallback` is trimming under the same budget;
:func:`prefetch` names the summary the next request will need.

Pure: no I/O, no clock; the token counter is handed in.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from policies.facts import MAX_FACTS, extract, merge
from policies.transcript import message_text, summary_messages
from policies.trim import Layout, clip_tool_result, trim, trim_units
from policies.types import (
    Budget,
    Clip,
    ContextTooLong,
    CountFn,
    Decision,
    Message,
    SummarizeSpec,
    SummaryState,
    SummaryTask,
    TrimSpec,
)
from policies.units import find_orphans, roles_of, where, where_system, without

SUMMARIZED = "summarized"
# Tokens the pinned facts may take at most, and the summary message's framing.
FACT_TOKENS = 160
SUMMARY_OVERHEAD = 24
_REASONS = (SUMMARIZED, "max_tokens", "orphan")


@dataclass(frozen=True)
class Plan:
    """Forward ``decision`` now; or make ``task`` first and :func:`assemble` its result."""

    decision: Decision | None = None
    task: SummaryTask | None = None
    # What to forward when the task cannot be done (trimming, same budget).
    fallback: Decision | None = None
    reused: SummaryState | None = None


def limit_of(spec: SummarizeSpec) -> int | None:
    """The token budget of the forwarded list: ``max_tokens``, else ``trigger_tokens``."""
    return spec.max_tokens if spec.max_tokens is not None else spec.trigger_tokens


def allowance(spec: SummarizeSpec, limit: int | None) -> tuple[int, int, int]:
    """Tokens for the whole summary message, the summarizer's answer, and the pinned facts."""
    if spec.summary_share is not None and limit is not None:
        total = int(spec.summary_share * limit)
    else:
        total = spec.summarizer.max_tokens + FACT_TOKENS + SUMMARY_OVERHEAD
    facts = min(FACT_TOKENS, total // 4)
    answer = max(16, min(spec.summarizer.max_tokens, total - facts - SUMMARY_OVERHEAD))
    return total, answer, facts


@dataclass
class _Shape:
    """A conversation's units, costs and prefix sums: everything a plan reads."""

    msgs: list[Message]
    costs: list[int]
    system: list[int]
    orphans: tuple[int, ...]
    bounds: list[int]  # unit k is messages [bounds[k], bounds[k + 1]); n + 1 entries
    prefix: list[int]  # prefix[k]: cost of units [0, k)
    base: int  # system messages plus the request's fixed cost
    fixed: int

    @property
    def n(self) -> int:
        return len(self.bounds) - 1

    def units_cost(self, lo: int, hi: int) -> int:
        return self.prefix[hi] - self.prefix[lo]

    def members(self, lo: int, hi: int) -> list[int]:
        """Messages of units [lo, hi) that belong to a unit (not system, not orphan)."""
        skip = sorted({*self.system, *self.orphans})
        return without(self.bounds[lo], self.bounds[hi], skip)


def _shape(
    messages: Sequence[Message], count: CountFn, fixed: int, sizes: Sequence[int] | None = None
) -> _Shape:
    msgs = list(messages)
    roles = roles_of(msgs)
    system = where_system(roles)
    orphans = find_orphans(msgs, roles)
    bounds = where(roles, "user")
    first_user = bounds[0] if bounds else len(msgs)
    skip = {*system, *orphans}
    if any(i not in skip for i in range(first_user)):
        bounds.insert(0, 0)
    bounds.append(len(msgs))
    costs = list(map(count, msgs)) if sizes is None else list(sizes)
    member = [0 if i in skip else c for i, c in enumerate(costs)]
    q = [0, *accumulate(member)]
    units = [q[bounds[k + 1]] - q[bounds[k]] for k in range(len(bounds) - 1)]
    base = sum(costs[i] for i in system) + fixed
    return _Shape(msgs, costs, system, orphans, bounds, [0, *accumulate(units)], base, fixed)


def plan(
    messages: Sequence[Message],
    spec: SummarizeSpec,
    count: CountFn,
    budget: Budget,
    states: Sequence[SummaryState] = (),
    sizes: Sequence[int] | None = None,
) -> Plan:
    """What to forward, or which summary to make first (see the module docstring).

    ``sizes``: each message's token count, when the caller has them (the
    proxy does): the plan then calls ``count`` only for messages it makes.
    """
    shape = _shape(messages, count, budget.fixed, sizes)
    return _plan(shape, spec, count, budget, states)


def _plan(
    shape: _Shape,
    spec: SummarizeSpec,
    count: CountFn,
    budget: Budget,
    states: Sequence[SummaryState],
    ahead: bool = False,
) -> Plan:
    """``ahead``: for :func:`prefetch`, which reads the task only (no view, no fallback)."""
    limit = budget.limit if budget.limit is not None else limit_of(spec)
    s = spec.keep_first_turns
    total, answer, fact_tokens = allowance(spec, limit)
    # Where a new summary would end now: no stored one may end later.
    cut = _new_cut(shape, spec, limit, total)
    state, cut0 = _best_state(shape, spec, states, cut)

    def view(state: SummaryState | None, cut: int) -> Plan:
        if ahead:
            return Plan(reused=state)
        return Plan(decision=_view(shape, spec, count, limit, state, cut), reused=state)

    if state is not None:
        cost = _summary_cost(state, spec, count)
        if not _over(shape, spec, limit, s + shape.n - cut0, _tokens(shape, s, cut0, cost)):
            return view(state, cut0)
    elif not _over(shape, spec, limit, shape.n, shape.base + shape.units_cost(0, shape.n)):
        return view(None, 0)
    if cut <= max(s, cut0):
        # Nothing more can be summarized: the view as it is, trimmed to the budget.
        return view(state, cut0)
    previous = state  # a usable state always covers at least one unit
    source = tuple(shape.members(cut0 if previous is not None else s, cut))
    empty = count({"content": ""})
    facts = merge(
        previous.facts if previous is not None else (),
        extract(message_text(shape.msgs[i]) for i in source),
        max_facts=MAX_FACTS,
        max_tokens=fact_tokens,
        count_text=lambda line: count({"content": line}) - empty,
    )
    members = shape.members(s, cut)
    task = SummaryTask(
        start_unit=s,
        cut_unit=cut,
        start=members[0] if members else shape.bounds[s],
        end=shape.bounds[cut],
        source=source,
        previous=previous,
        facts=facts,
        max_tokens=answer,
    )
    backup = None if ahead else fallback(shape.msgs, spec, count, budget)
    return Plan(task=task, fallback=backup)


def assemble(
    messages: Sequence[Message],
    spec: SummarizeSpec,
    count: CountFn,
    budget: Budget,
    state: SummaryState,
    sizes: Sequence[int] | None = None,
) -> Decision:
    """The view with ``state`` (a summary just made for a task of this conversation);
    ``sizes`` as for :func:`plan`."""
    shape = _shape(messages, count, budget.fixed, sizes)
    limit = budget.limit if budget.limit is not None else limit_of(spec)
    cut = _unit_at(shape, state.covers)
    if cut is None or state.start_unit != spec.keep_first_turns or cut <= state.start_unit:
        raise ValueError(f"the summary does not cover whole units here: {state.covers}")
    return _view(shape, spec, count, limit, state, cut)


def fallback(
    messages: Sequence[Message], spec: SummarizeSpec, count: CountFn, budget: Budget
) -> Decision:
    """Trimming under the same budget: the trigger's turns, the budget's tokens."""
    limit = budget.limit if budget.limit is not None else limit_of(spec)
    trim_spec = TrimSpec(
        max_turns=spec.trigger_turns,
        max_tokens=limit,
        tool_output_max_tokens=spec.tool_output_max_tokens,
    )
    return trim(messages, trim_spec, count, Budget(limit=limit, fixed=budget.fixed))


def prefetch(
    messages: Sequence[Message],
    spec: SummarizeSpec,
    count: CountFn,
    budget: Budget,
    states: Sequence[SummaryState] = (),
    sizes: Sequence[int] | None = None,
) -> SummaryTask | None:
    """The summary the next request will need, when it is near: None when it is not.

    ``messages`` is the history so far, the answer included. The next
    request is imagined as one more user turn that costs what the newest
    turn did (at least ``prefetch_margin`` of each token limit), so a
    summary is made before the trigger is crossed. Indexes in the task refer
    to ``messages``; ``sizes`` their token counts, as for :func:`plan`.
    """
    if not spec.prefetch:
        return None
    ahead = [*messages, {"role": "user", "content": ""}]
    if sizes is not None:
        sizes = [*sizes, count(ahead[-1])]
    shape = _shape(ahead, count, budget.fixed, sizes)
    newest = shape.units_cost(shape.n - 2, shape.n - 1) if shape.n > 1 else 0
    limit = budget.limit if budget.limit is not None else limit_of(spec)

    def lower(value: int | None) -> int | None:
        if value is None:
            return None
        return max(1, value - max(int(spec.prefetch_margin * value), newest))

    scaled = dataclasses.replace(
        spec, trigger_tokens=lower(spec.trigger_tokens), max_tokens=lower(limit)
    )
    try:
        found = _plan(shape, scaled, count, Budget(fixed=budget.fixed), states, ahead=True)
    except ContextTooLong:
        return None
    task = found.task
    if task is None:
        return None
    # The answer budget is the real spec's, not the scaled one's.
    return dataclasses.replace(task, max_tokens=allowance(spec, limit)[1])


def _unit_at(shape: _Shape, index: int) -> int | None:
    """The unit that starts at message ``index`` (None when no unit starts there)."""
    k = bisect_left(shape.bounds, index, 0, shape.n)
    return k if k < shape.n and shape.bounds[k] == index else None


def _best_state(
    shape: _Shape, spec: SummarizeSpec, states: Sequence[SummaryState], latest: int
) -> tuple[SummaryState | None, int]:
    """The usable state covering the most units, and its cut (0 without one).

    Usable: it starts where this spec's summaries start and ends where a
    unit starts, no later than ``latest``, the cut a new summary would make
    now (so it leaves ``keep_last_turns`` unless the budget says otherwise,
    and never covers the newest unit). A summary made ahead for a longer
    conversation (a retried request) is not usable.
    """
    best: SummaryState | None = None
    best_cut = 0
    newest = min(shape.n - 1, latest)
    for state in states:
        cut = _unit_at(shape, state.covers)
        if cut is None or state.start_unit != spec.keep_first_turns:
            continue
        if state.start_unit < cut <= newest and cut > best_cut:
            best, best_cut = state, cut
    return best, best_cut


def _summary_cost(state: SummaryState, spec: SummarizeSpec, count: CountFn) -> int:
    return sum(map(count, summary_messages(state.text, state.facts, spec.placement)))


def _tokens(shape: _Shape, s: int, cut: int, summary: int) -> int:
    return shape.base + shape.units_cost(0, s) + summary + shape.units_cost(cut, shape.n)


def _over(shape: _Shape, spec: SummarizeSpec, limit: int | None, turns: int, tokens: int) -> bool:
    if spec.trigger_turns is not None and turns > spec.trigger_turns:
        return True
    if spec.trigger_tokens is not None and tokens > spec.trigger_tokens:
        return True
    return limit is not None and tokens > limit


def _new_cut(shape: _Shape, spec: SummarizeSpec, limit: int | None, total: int) -> int:
    """The first unit to keep verbatim after a new summary (never past the newest)."""
    n, s = shape.n, spec.keep_first_turns
    if n - 1 <= s:
        return s  # the first units and the newest are all there is: nothing to summarize
    cut = s + 1
    if spec.keep_last_turns is not None:
        cut = max(cut, n - spec.keep_last_turns)
    limits = [x for x in (limit, spec.trigger_tokens) if x is not None]
    if limits:
        target = spec.low_water * min(limits)
        head = shape.base + shape.units_cost(0, s) + total
        while cut < n - 1 and head + shape.units_cost(cut, n) > target:
            cut += 1
    return min(cut, n - 1)


def _view(
    shape: _Shape,
    spec: SummarizeSpec,
    count: CountFn,
    limit: int | None,
    state: SummaryState | None,
    cut: int,
) -> Decision:
    """Head units, the summary, the units from ``cut``; trimmed to ``limit``."""
    msgs = shape.msgs
    system, orphans = set(shape.system), set(shape.orphans)
    s = spec.keep_first_turns
    synthetic: list[Message] = []
    lo = hi = insert_at = -1
    if state is not None:
        synthetic = summary_messages(state.text, state.facts, spec.placement)
        lo, hi = shape.bounds[s], shape.bounds[cut]
        firsts = shape.members(s, s + 1)
        insert_at = firsts[0] if firsts else lo
    out: list[Message] = []
    origin: list[int] = []  # index in msgs, or -1 for a summary message
    summarized: list[int] = []
    for i, message in enumerate(msgs):
        if i == insert_at:
            out += synthetic
            origin += [-1] * len(synthetic)
        if i in system:
            pass
        elif i in orphans:
            continue
        elif lo <= i < hi:
            summarized.append(i)
            continue
        out.append(message)
        origin.append(i)
    roles = [m.get("role") for m in out]
    layout = Layout(
        system=[j for j, o in enumerate(origin) if o < 0 or o in system],
        orphans=(),
        starts=[j for j, o in enumerate(origin) if o >= 0 and roles[j] == "user"],
        clippable=[j for j, o in enumerate(origin) if o >= 0 and roles[j] == "tool"],
    )
    fit = TrimSpec(max_tokens=limit, tool_output_max_tokens=spec.tool_output_max_tokens)
    trimmed = trim_units(out, layout, fit, count, Budget(limit, shape.fixed), clip_tool_result)
    kept = tuple(origin[j] for j in trimmed.kept if origin[j] >= 0)
    kept_set = set(kept)
    dropped_by = {
        SUMMARIZED: len(summarized),
        "max_tokens": len(trimmed.dropped),
        "orphan": len(orphans),
    }
    extra: dict[str, object] = {"dropped_by": dropped_by}
    if state is not None:
        tokens = sum(map(count, synthetic))
        extra["summary"] = {
            "id": state.id,
            "start_unit": s,
            "cut_unit": cut,
            "covers": state.covers,
            "units": cut - s,
            "facts": len(state.facts),
            "tokens": tokens,
            "placement": spec.placement,
        }
        extra["summary_tokens"] = tokens
    best = max(_REASONS, key=lambda r: (dropped_by[r], -_REASONS.index(r)))
    return Decision(
        messages=trimmed.messages,
        kept=kept,
        dropped=tuple(i for i in range(len(msgs)) if i not in kept_set and i not in system),
        repaired=shape.orphans,
        clipped=tuple(
            Clip(origin[c.index], c.tokens_before, c.tokens_after) for c in trimmed.clipped
        ),
        turns_dropped=(cut - s if state is not None else 0) + trimmed.turns_dropped,
        reason=best if dropped_by[best] else None,
        tokens_before=sum(shape.costs) + shape.fixed,
        tokens_after=trimmed.tokens_after,
        budget=limit,
        extra=extra,
    )
