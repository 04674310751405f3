"""`strategy: trim`: keep the newest turns that fit the limits, clip oversize tool output.

The rules (every result obeys them; tests check each one):

- Units are dropped whole, oldest first: the leading pseudo-turn, then turns
  (see :mod:`policies.units`). The newest unit is never dropped.
- System and developer messages are forwarded as the very same objects, at
  their positions relative to the kept messages.
- Orphaned tool calls and results (broken client input) are dropped and listed
  in ``Decision.repaired``.
- Tool results over ``tool_output_max_tokens`` are clipped in every kept unit
  but the newest; in the newest only when nothing else meets the budget.
- The forwarded messages plus ``budget.fixed`` fit the limit, or
  :class:`ContextTooLong` is raised.

``max_turns`` keeps the last N units, so a leading pseudo-turn counts as one
(it is older than every user turn and goes first); ``turns_dropped`` counts
units the same way. With both limits, the cut is the deeper of the two.
``Decision.reason`` names the cause that alone would have dropped the most
messages (``extra["dropped_by"]`` holds the three counts); on a tie
``max_turns`` beats ``max_tokens`` beats ``orphan``. Clipping alone is no
drop and gives no reason; ``Decision.clipped`` records it.

Choosing the cut with ``low_water`` (hysteresis) needs no state: the request
replays the conversation's growth unit by unit with prefix sums. At step ``t``
the newest unit is ``t-1``; when the kept units plus system messages and
``fixed`` exceed the limit, the cut advances until the *older* kept units plus
system messages and ``fixed`` are within ``low_water * limit`` and everything
fits the limit. Measuring the low-water mark without the newest unit (the
issue's sketch measures it with) matters: a client sends the newest turn a
piece at a time (the user message, then each tool result), and a mark that
includes it would move the cut again on the next request of the same turn
with no budget crossed. Without the newest unit, the cut a request computes
is the cut every later request computes, until the kept suffix really
overflows (proof sketch in tests/policies/test_properties.py).

In the replay, older units cost what they will cost once clipped: a tool
result over the cap counts as the cap (an upper bound; the real clip is at
most that), so only kept results are ever clipped and the replay stays O(units).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import add, sub
from typing import Any

from policies.mask import Cover, placeholder
from policies.mask import horizon as mask_horizon
from policies.types import (
    Budget,
    Clip,
    ContextTooLong,
    CountFn,
    Decision,
    Mask,
    MaskSpec,
    Message,
    TrimSpec,
)
from policies.units import find_orphans, roles_of, where, where_system, without

MARKER = "\n[... ctxproxy clipped {tokens} tokens of tool output ...]\n"

# Ties between reasons go to the first here: a configured turn count explains a
# drop more plainly than a token total, and both more than a repair.
_REASONS = ("max_turns", "max_tokens", "orphan")


def budget_limit(spec: TrimSpec, context_window: int | None, reserve: int) -> int | None:
    """Tokens the message list may use: the stricter of the two limits.

    ``max_tokens`` is an absolute prompt budget the operator chose; it is not
    shrunk by the answer's reserve (a client asking for a long answer must not
    turn every request into a 400). ``context_fraction`` is a share of the
    model's window, and the window must also hold the answer, so the request's
    ``max_tokens`` / ``max_completion_tokens`` (``reserve``) comes off it. When
    the window is unknown only ``max_tokens`` counts. None when no token limit
    applies. Never negative.
    """
    limits: list[int] = []
    if spec.max_tokens is not None:
        limits.append(spec.max_tokens)
    if spec.context_fraction is not None and context_window:
        limits.append(max(0, int(spec.context_fraction * context_window) - max(0, reserve)))
    return min(limits) if limits else None


# Shortens one element's text to a token target: the new element and its count,
# or None when it fits or has nothing to shorten (see clip_tool_result).
ClipFn = Callable[[Message, int, CountFn, int], tuple[Message, int] | None]


@dataclass(frozen=True)
class Layout:
    """Where a list's units are, as ascending indexes into it.

    Trimming itself is format-blind: chat messages (:func:`trim`) and
    Responses items (``policies.items``) each say which elements are pinned,
    which are broken input to drop, where turns start and what may be clipped.
    """

    # Never dropped, in no unit (system and developer messages).
    system: Sequence[int]
    # Dropped as repairs (unpaired tool calls and results), in no unit.
    orphans: tuple[int, ...]
    # Where each turn starts. Elements before the first start that are neither
    # pinned nor orphans form the leading pseudo-turn.
    starts: Sequence[int]
    # Elements whose text may be clipped to ``tool_output_max_tokens``.
    clippable: Sequence[int]


def trim(
    messages: Sequence[Message],
    spec: TrimSpec,
    count: CountFn,
    budget: Budget,
    costs: Sequence[int] | None = None,
) -> Decision:
    """Apply ``spec`` to ``messages``; see the module docstring for the rules.

    ``costs``: what ``count`` gives for each of ``messages``, when the caller has it
    (a session's counts are known): not asked for again, one message at a time.

    ``budget.limit`` is the token limit (see :func:`budget_limit`); when it is
    None, ``spec.max_tokens`` is used as is, so a caller without a budget still
    gets the spec's limit.

    Work is linear in the messages with whole-list passes where possible (a
    request is read on every call, so the per-message constant is what scales).
    """
    msgs = list(messages)
    roles = roles_of(msgs)
    layout = Layout(
        system=where_system(roles),
        orphans=find_orphans(msgs, roles),
        starts=where(roles, "user"),
        clippable=where(roles, "tool"),
    )
    masks = None
    if spec.mask_tool_outputs is not None:
        masks = mask_candidates(msgs, layout.clippable, spec.mask_tool_outputs, count)
    return trim_units(msgs, layout, spec, count, budget, clip_tool_result, masks, costs)


def trim_units(
    elements: Sequence[Message],
    layout: Layout,
    spec: TrimSpec,
    count: CountFn,
    budget: Budget,
    clip: ClipFn,
    masks: Mapping[int, tuple[Message, int]] | None = None,
    known: Sequence[int] | None = None,
) -> Decision:
    """:func:`trim` over any list whose units ``layout`` describes; ``clip`` shortens one.

    ``masks``: tool results that may be masked (index -> placeholder and its
    count; see :func:`masked_replay`), with ``spec.mask_tool_outputs`` set;
    ``known``: each element's count, when the caller has them.
    """
    msgs = list(elements)
    total_n = len(msgs)
    costs = list(map(count, msgs)) if known is None else list(known)
    if len(costs) != total_n:
        raise ValueError(f"{len(costs)} counts for {total_n} elements")
    fixed = budget.fixed
    limit = budget.limit if budget.limit is not None else spec.max_tokens
    cap = spec.tool_output_max_tokens

    orphans = layout.orphans
    system = layout.system
    # Units start at 0 (the pseudo-turn, when it has a message left) and at each
    # turn start; system messages and orphans inside them cost nothing below.
    bounds = list(layout.starts)
    first_user = bounds[0] if bounds else total_n
    if first_user - bisect_left(system, first_user) - bisect_left(orphans, first_user) > 0:
        bounds.insert(0, 0)
    n = len(bounds)
    bounds.append(total_n)

    # Per message: what it costs inside its unit (0 for system and orphans), as
    # is and as it will cost once clipped; prefix sums make any unit O(1).
    member = costs.copy()
    for i in (*system, *orphans):
        member[i] = 0
    oversize = []
    if cap is not None:
        oversize = [i for i in layout.clippable if member[i] > cap]
    q_raw = [0, *accumulate(member)]
    raw = _unit_sums(q_raw, bounds)
    sim = raw
    if oversize and cap is not None:
        capped = member.copy()
        for i in oversize:
            capped[i] = cap
        sim = _unit_sums([0, *accumulate(capped)], bounds)
    base = sum(costs[i] for i in system) + fixed

    cut_turns = max(0, n - max(1, spec.max_turns)) if spec.max_turns is not None else 0
    cut_tokens = 0
    horizon = 0  # units whose maskable results are masked: [0, horizon)
    mask_spec = spec.mask_tool_outputs
    if masks and mask_spec is not None and limit is not None and n:
        room = limit - base
        low_room = room if spec.low_water is None else spec.low_water * limit - base
        cut_tokens, horizon = masked_replay(
            sim,
            raw,
            _unit_savings(masks, sim_of(member, oversize, cap), bounds, n),
            room,
            low_room,
            mask_spec.after_turns,
        )
    elif masks and mask_spec is not None and n:
        # No token budget to cross: masking moves by its own steps (policies.mask).
        tokens = [0] * n
        for i in masks:
            k = bisect_left(bounds, i + 1) - 1
            if 0 <= k < n:
                tokens[k] += costs[i]
        horizon = mask_horizon(tokens, mask_spec.after_turns, mask_spec.step_tokens)
    if limit is not None and n and not (masks and mask_spec is not None):
        room = limit - base
        if spec.low_water is None:
            cut_tokens = _minimal_cut(sim, raw, room)
        else:
            cut_tokens = _hysteresis_cut(sim, raw, room, spec.low_water * limit - base)
    cut = max(cut_turns, cut_tokens)

    replaced: dict[int, tuple[Message, int]] = {}
    masked_at: list[int] = []
    if horizon > cut and masks:
        # Mask the maskable results of the kept units the replay masked.
        orphan_set = set(orphans)
        for i, placeholder in masks.items():
            if bounds[cut] <= i < bounds[horizon] and i not in orphan_set:
                replaced[i] = placeholder
                masked_at.append(i)
    # Clip oversize results in the kept units but the newest.
    newest_start = bounds[n - 1] if n else total_n
    for i in oversize:
        if bounds[cut] <= i < newest_start and cap is not None and i not in replaced:
            clipped = clip(msgs[i], cap, count, costs[i])
            if clipped is not None:
                replaced[i] = clipped

    def saving(lo: int, hi: int) -> int:
        return sum(costs[i] - c for i, (_, c) in replaced.items() if lo <= i < hi)

    total = base + q_raw[total_n] - q_raw[bounds[cut]] - saving(bounds[cut], total_n)
    if limit is not None:
        # The replay's clip estimate is an upper bound, so this only runs when a
        # clip could not reach the cap: drop more units until the real total fits.
        while total > limit and cut < n - 1:
            total -= raw[cut] - saving(bounds[cut], bounds[cut + 1])
            cut += 1
            cut_tokens = cut
        if total > limit and cap is not None and n:
            # Only the newest unit is left: clip its results, largest first.
            newest = sorted((i for i in oversize if i >= newest_start), key=lambda i: -costs[i])
            for i in newest:
                clipped = clip(msgs[i], cap, count, costs[i])
                if clipped is not None:
                    replaced[i] = clipped
                    total -= costs[i] - clipped[1]
                if total <= limit:
                    break
        if total > limit:
            raise ContextTooLong(total, limit)

    start = bounds[cut]
    kept = [i for i in system if i < start]
    kept += without(start, total_n, orphans)
    dropped = without(0, start, system)
    dropped += (i for i in orphans if i >= start)
    if replaced:
        out = [replaced[i][0] if i in replaced else msgs[i] for i in kept]
    else:
        out = list(map(msgs.__getitem__, kept))
    masked_set = set(masked_at)
    clips = tuple(
        Clip(index=i, tokens_before=costs[i], tokens_after=replaced[i][1])
        for i in sorted(replaced)
        if i >= start and i not in masked_set
    )
    masked = tuple(
        Mask(index=i, tokens_before=costs[i], tokens_after=replaced[i][1])
        for i in sorted(masked_at)
        if i >= start
    )

    def members_before(k: int) -> int:
        """Messages in units[:k] (system messages and orphans are in no unit)."""
        bound = bounds[k]
        return bound - bisect_left(system, bound) - bisect_left(orphans, bound)

    dropped_by = {
        "max_turns": members_before(cut_turns),
        "max_tokens": members_before(cut_tokens),
        "orphan": len(orphans),
    }
    return Decision(
        messages=out,
        kept=tuple(kept),
        dropped=tuple(dropped),
        repaired=orphans,
        clipped=clips,
        masked=masked,
        turns_dropped=cut,
        reason=_reason(dropped_by),
        tokens_before=sum(costs) + fixed,
        tokens_after=total,
        budget=limit,
        extra={"dropped_by": dropped_by},
    )


def mask_candidates(
    msgs: Sequence[Message],
    maskable: Sequence[int],
    spec: MaskSpec,
    count: CountFn,
    cover: Cover = placeholder,
) -> dict[int, tuple[Message, int]]:
    """The elements ``spec`` may mask (of ``maskable``): index -> the placeholder and its count."""
    out: dict[int, tuple[Message, int]] = {}
    for i in maskable:
        tokens = count(msgs[i])
        if tokens < spec.min_tokens:
            continue
        masked = cover(msgs[i], tokens)
        after = count(masked)
        if after < tokens:
            out[i] = (masked, after)
    return out


def sim_of(member: list[int], oversize: list[int], cap: int | None) -> list[int]:
    """Each message's cost in the replay (a result over the cap counts as the cap)."""
    if not oversize or cap is None:
        return member
    capped = member.copy()
    for i in oversize:
        capped[i] = cap
    return capped


def _unit_savings(
    masks: Mapping[int, tuple[Message, int]], sim: list[int], bounds: list[int], n: int
) -> list[int]:
    """Per unit: the replay tokens masking its maskable results saves."""
    out = [0] * n
    for i, (_, after) in masks.items():
        k = bisect_left(bounds, i + 1) - 1
        if 0 <= k < n:
            out[k] += max(0, sim[i] - after)
    return out


def masked_replay(
    sim: list[int],
    raw: list[int],
    save: list[int],
    room: int,
    low_room: float,
    after_turns: int,
) -> tuple[int, int]:
    """Trimming's replay with masking: the cut and the mask horizon (both in units).

    The horizon moves only when the budget is crossed, where the forwarded
    prefix changes anyway (a prompt cache loses it once, for both): every
    result old enough (in units older than the last ``after_turns``) is masked
    first, and turns are dropped only if the older units still exceed the
    low-water mark or everything the limit. Between crossings nothing moves.
    """
    prefix = [0, *accumulate(sim)]
    saved = [0, *accumulate(save)]
    cut = horizon = 0

    def older(t: int) -> int:
        masked = saved[horizon] - saved[cut] if horizon > cut else 0
        return prefix[t - 1] - prefix[cut] - masked

    for t in range(1, len(sim) + 1):
        newest = raw[t - 1]
        if older(t) + newest <= room:
            continue
        horizon = max(horizon, t - after_turns)
        while cut < t - 1 and (older(t) > low_room or older(t) + newest > room):
            cut += 1
    return cut, horizon


def _unit_sums(prefix: list[int], bounds: list[int]) -> list[int]:
    """Each unit's total, ``prefix[bounds[k + 1]] - prefix[bounds[k]]``, in C (one a turn)."""
    at = list(map(prefix.__getitem__, bounds))
    return list(map(sub, at[1:], at[:-1]))


def _reason(dropped_by: dict[str, int]) -> str | None:
    """The cause that alone would have dropped the most messages; ties in _REASONS order."""
    best = max(_REASONS, key=lambda r: (dropped_by[r], -_REASONS.index(r)))
    return best if dropped_by[best] else None


def _minimal_cut(sim: list[int], raw: list[int], room: int) -> int:
    """The first unit to keep so that the most newest units fit ``room``."""
    n = len(sim)
    kept = raw[-1] + sum(sim[:-1])
    cut = 0
    while kept > room and cut < n - 1:
        kept -= sim[cut]
        cut += 1
    return cut


def _hysteresis_cut(sim: list[int], raw: list[int], room: int, low_room: float) -> int:
    """Replay the growth unit by unit; advance the cut only when the budget is crossed.

    At step ``t`` the older units cost ``prefix[t] - prefix[cut]`` and the newest
    ``raw[t]``: the budget is crossed where ``prefix[t] + raw[t]`` passes
    ``room + prefix[cut]``, so a step between crossings is one comparison.
    """
    prefix = [0, *accumulate(sim)]
    cut = 0
    crossed = room  # room + prefix[cut]
    for t, reach in enumerate(map(add, prefix, raw)):
        if reach > crossed:
            total = prefix[t]
            older = total - prefix[cut]
            newest = raw[t]
            while cut < t and (older > low_room or older + newest > room):
                cut += 1
                older = total - prefix[cut]
            crossed = room + prefix[cut]
    return cut


def clip_tool_result(
    message: Message, target: int, count: CountFn, before: int | None = None
) -> tuple[Message, int] | None:
    """A copy of ``message`` whose text keeps its head and tail, within ``target`` tokens.

    Returns the new message and its count, or None when the message fits or
    has no text to clip. Only text is shortened (a string, or the ``text`` of
    text parts); other parts stay. The kept length is found by measuring with
    ``count`` (a proportional first guess, then bisection to within 0.4% of
    the text). When even the marker alone is over ``target``, the result is
    the marker alone if that is smaller than the original.
    """
    if before is None:
        before = count(message)
    if before <= target:
        return None
    content = message.get("content")
    length = _text_length(content)
    if length == 0:
        return None

    def build(kept: int, cut_tokens: int) -> dict[str, Any]:
        marker = MARKER.format(tokens=cut_tokens)
        return {**message, "content": _clip_content(content, kept, marker)}

    # Measure with the marker stating the original size: its number has at
    # least as many digits as the final one, so the final one is no larger.
    def measure(kept: int) -> int:
        return count(build(kept, before))

    floor = measure(0)
    if floor > target:
        if floor >= before:
            return None
        best = 0
    else:
        lo, hi = 0, length  # build(lo) fits; build(hi), the whole text, does not
        guess = min(length - 1, length * (target - floor) // max(1, before - floor))
        if guess > 0:
            if measure(guess) <= target:
                lo = guess
            else:
                hi = guess
        tolerance = max(1, length // 256)
        while hi - lo > tolerance:
            mid = (lo + hi) // 2
            if measure(mid) <= target:
                lo = mid
            else:
                hi = mid
        best = lo
    placeholder = build(best, before)
    placeholder_tokens = count(placeholder)
    final = build(best, before - placeholder_tokens)
    final_tokens = count(final)
    if final_tokens > placeholder_tokens:
        return placeholder, placeholder_tokens
    return final, final_tokens


def _text_length(content: object) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(text) for part in content if (text := _part_text(part)) is not None)
    return 0


def _part_text(part: object) -> str | None:
    if isinstance(part, Mapping) and part.get("type") == "text":
        text = part.get("text")
        if isinstance(text, str):
            return text
    return None


def _clip_content(content: object, kept: int, marker: str) -> object:
    """Keep the first ``kept - kept // 2`` and last ``kept // 2`` characters of the text."""
    head = kept - kept // 2
    tail = kept // 2
    if isinstance(content, str):
        return content[:head] + marker + content[len(content) - tail :]
    assert isinstance(content, list)
    tail_start = _text_length(content) - tail
    out: list[object] = []
    pos = 0
    marked = False
    for part in content:
        text = _part_text(part)
        if text is None:
            out.append(part)
            continue
        assert isinstance(part, Mapping)
        a, b = pos, pos + len(text)
        pos = b
        piece = text[: max(0, min(b, head) - a)]
        if not marked and b >= head:
            piece += marker
            marked = True
        if b > tail_start:
            piece += text[max(0, tail_start - a) :]
        if piece:
            out.append({**part, "text": piece})
    return out
