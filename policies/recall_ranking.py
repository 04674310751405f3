"""Recall's choice: units scored from the index's hits, taken best first while they fit.

A hit lends its score to the units up to ``neighbors`` away (the answer
after a question, the question before an answer; more after than before),
summed over hits, and the best-scored units that fit come back, whichever
hit they came from (so budget goes to a second hit's own message before a
first hit's farthest neighbor). Budget left then goes to more context
around the best hits (:meth:`Ranking.fill`).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from policies.recall_units import Picker, Span

# What quoting adds to a message's own count, in practice: the JSON wrapper
# ({"position":N,"role":...,"text":...}, about 12 tokens) and its newline, less
# the message's own frame (about 4), and escapes. An estimate for choosing: the
# exact count gives back the last units if it is short (measured in
# bench/recall.py: 8 and 10 keep the same LoCoMo evidence, 12 0.8 points less).
LINE_TOKENS = 10

# How a hit's score spreads to the units around it, up to ``neighbors`` units
# away: the unit k after a hit gets AFTER ** k of it (the answer to a question
# sits right after it), the unit k before BEFORE ** k (measured in
# bench/recall.py: 0.7 and 0.5 against 0.5/0.5, 0.8/0.5, 0.7/0.3, 0.6/0.4).
AFTER = 0.7
BEFORE = 0.5


@dataclass(frozen=True)
class Hit:
    """A stored message the index found: its position in the request's list and score."""

    index: int
    score: float
    # The store's id of the message (for the request row); None when unknown.
    item_id: int | None = None


def take(
    order: Iterable[Span],
    chosen: list[Span],
    cost: Callable[[Span], int],
    used: int,
    room: int,
) -> int:
    """Add the units of ``order`` that fit to ``chosen``; a unit that does not fit is skipped."""
    seen = set(chosen)
    for span in order:
        if room - used < LINE_TOKENS:
            break  # no unit costs less
        if span in seen:
            continue
        spent = cost(span)
        if used + spent > room:
            continue
        chosen.append(span)
        seen.add(span)
        used += spent
    return used


class Ranking:
    """The units that may come back, scored: each hit's unit gets the hit's score,
    and the units up to ``neighbors`` away on each side a share of it
    (:data:`AFTER` and :data:`BEFORE` to the power of the distance), summed
    over hits. The unit right after a question that names the topic holds
    the answer; a unit between two hits outranks one beside a single hit."""

    def __init__(self, picker: Picker, hits: Sequence[Hit], neighbors: int) -> None:
        self.picker = picker
        n = picker.n
        unit_at, walk = picker.unit_at, picker.walk
        # Each hit unit's best hit, best first.
        best: dict[Span, Hit] = {}
        for hit in hits:
            if not 0 <= hit.index < n:
                continue
            span = unit_at(hit.index)
            if span is None:
                continue
            held = best.get(span)
            if held is None or (hit.score, hit.index) > (held.score, held.index):
                best[span] = hit
        self.best = sorted(best.items(), key=lambda b: (-b[1].score, -b[1].index))
        # Summed in this order (a hit's unit, then before, then after, nearest
        # first), so a unit's score is the same float however it is reached.
        scores: dict[Span, float] = {}
        get = scores.get
        # For each best hit, before then after: the unit ``neighbors`` away
        # (None: that side ended), where :meth:`fill` goes on from.
        self._ends: list[Span | None] = []
        shares = [[decay**k for k in range(1, neighbors + 1)] for decay in (BEFORE, AFTER)]
        for span, hit in self.best:
            score = hit.score
            scores[span] = get(span, 0.0) + score
            for side in (0, 1):
                near = walk(span, side, neighbors) if neighbors else []
                for unit, share in zip(near, shares[side], strict=False):
                    scores[unit] = get(unit, 0.0) + score * share
                if not neighbors:
                    self._ends.append(span)
                else:
                    self._ends.append(near[-1] if len(near) == neighbors else None)
        self.scores = scores

    def order(self) -> list[Span]:
        """The scored units, best first (ties: the later one; units never share a start)."""
        return [span for _, _, span in sorted((-v, -s[0], s) for s, v in self.scores.items())]

    def fill(
        self,
        rounds: int,
        chosen: list[Span],
        cost: Callable[[Span], int],
        used: int,
        room: int,
    ) -> int:
        """Units past ``neighbors`` around the hits into ``chosen`` while they fit:
        a unit a side per hit per round, best hit first, at most ``rounds``
        units further; a side whose next unit does not fit is done."""
        if room - used < LINE_TOKENS:
            return used
        step = self.picker.step
        sides = [None if near is None else step(near, k % 2) for k, near in enumerate(self._ends)]
        seen = set(chosen)
        for _ in range(rounds):
            if room - used < LINE_TOKENS or not any(sides):
                break
            for k, near in enumerate(sides):
                if near is None:
                    continue
                if near not in seen:
                    spent = cost(near)
                    if used + spent > room:
                        sides[k] = None
                        continue
                    chosen.append(near)
                    seen.add(near)
                    used += spent
                sides[k] = step(near, k % 2)
        return used
