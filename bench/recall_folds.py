"""Leave-one-conversation-out tuning for bench/recall.py: figures not chosen on what they measure.

A setting chosen on the same conversations it is measured on flatters itself.
Here every candidate setting's outcome is known per question (it is cheap to
record while the bench runs); for each conversation of the data set in turn,
the setting is chosen on the *other* conversations' questions and measured on
the held-out one. The folds' held-out figures, their spread and their pooled
figure (every question counted once, each by the setting its fold chose) are
printed beside the in-sample best, so a grid that overfits shows as a gap.

Choosers: :func:`best` (the most evidence kept; ties go to the earlier
setting in the grid, which lists the cheaper or simpler first) and
:func:`knee` (the modes' rule: the smallest recall share past which another
tenth of the budget adds under 5 points).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from policies.types import Decision, RecallSpec
from proxy.context.recall import RecallService

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


@dataclass(frozen=True)
class Outcome:
    """One question under one setting: did every evidence turn reach the upstream."""

    conversation: int  # the question's fold (its conversation, in LoCoMo)
    category: int
    kept: bool
    sent: float  # forwarded tokens / the full history's


@dataclass(frozen=True)
class Knobs:
    """One point of the recall grid."""

    share: float
    neighbors: int
    weight: float | None  # None: lexical only (``embeddings: none``)
    expand: bool = False

    @property
    def label(self) -> str:
        how = "lexical" if self.weight is None else f"w{self.weight}"
        return f"s{self.share} n{self.neighbors} {how}" + (" expand" if self.expand else "")

    def spec(self) -> RecallSpec:
        if self.weight is None:
            return RecallSpec(share=self.share, neighbors=self.neighbors, expand=self.expand)
        return RecallSpec(
            share=self.share,
            neighbors=self.neighbors,
            embeddings="wordllama",
            semantic_weight=self.weight,
        )


def grid(quick: bool) -> tuple[Knobs, ...]:
    """The knobs that move evidence kept (docs/benchmarks/recall.md): share, neighbors, the
    fusion weight (or none), expand for lexical. ``quick``: the neighbors at 2 only."""
    shares = (0.7, 0.8, 0.9)
    neighbors = (2,) if quick else (1, 2, 3)
    weights: tuple[float | None, ...] = (None, 0.2, 0.3, 0.4, 0.5, 0.6)
    out = [Knobs(s, n, w) for w in weights for s in shares for n in neighbors]
    out += [Knobs(s, n, None, expand=True) for s in shares for n in neighbors]
    return tuple(out)


@dataclass(frozen=True)
class Fold:
    held_out: int
    chosen: str
    train: float  # the chosen setting's share kept on the other conversations
    test: list[Outcome]  # the held-out conversation's outcomes under it


Chooser = Callable[[dict[str, list[Outcome]], set[int]], str]


def rate(outcomes: Sequence[Outcome], conversations: set[int] | None = None) -> float:
    picked = [o for o in outcomes if conversations is None or o.conversation in conversations]
    return sum(o.kept for o in picked) / len(picked) if picked else 0.0


def best(by_setting: dict[str, list[Outcome]], train: set[int]) -> str:
    """The setting that keeps the most on ``train``; the first in grid order on a tie."""
    return max(by_setting, key=lambda label: rate(by_setting[label], train))


def knee(by_setting: dict[str, list[Outcome]], train: set[int]) -> str:
    """The smallest setting (in order) past which the next adds under 5 points on ``train``."""
    labels = list(by_setting)
    for here, after in pairwise(labels):
        if rate(by_setting[after], train) - rate(by_setting[here], train) < 0.05:
            return here
    return labels[-1]


def folds(by_setting: dict[str, list[Outcome]], choose: Chooser) -> list[Fold]:
    everyone = {o.conversation for outcomes in by_setting.values() for o in outcomes}
    out = []
    for held in sorted(everyone):
        train = everyone - {held}
        chosen = choose(by_setting, train)
        test = [o for o in by_setting[chosen] if o.conversation == held]
        out.append(Fold(held, chosen, rate(by_setting[chosen], train), test))
    return out


async def sweep(
    bench: Any,
    service: RecallService,
    stored: list[list[Any]],
    questions: list[Any],
    knobs: Sequence[Knobs],
) -> dict[str, dict[str, list[Outcome]]]:
    """Every question under every setting at each of the bench's budgets: ``{budget: {setting:
    outcomes}}``. The conversations are stored (and embedded, for the weighted settings); the
    window under each share is cut once per question and budget."""
    out: dict[str, dict[str, list[Outcome]]] = {}
    for q in questions:
        a = bench.ask(stored[q.conversation], q)
        for fraction in bench.FRACTIONS:
            limit = int(fraction * a.total)
            budget = f"{int(fraction * 100)}%"
            windows: dict[int, Decision] = {}
            for k in knobs:
                base, decision, outcome = await bench.recall_at(
                    service, k.spec(), limit, a, windows
                )
                ok = bench.retained(base, outcome.recalled.spans, q.evidence)
                sent = decision.tokens_after / max(1, decision.tokens_before)
                out.setdefault(budget, {}).setdefault(k.label, []).append(
                    Outcome(q.fold, q.category, ok, sent)
                )
    return out


def _pct(outcomes: Sequence[Outcome], category: int | None = None) -> str:
    picked = [o for o in outcomes if category is None or o.category == category]
    return f"{100 * rate(picked):5.1f}%" if picked else "    -"


def print_folds(
    title: str,
    by_setting: dict[str, list[Outcome]],
    defaults: Sequence[str],
    choose: Chooser = best,
    names: Sequence[str] = (),
) -> list[Outcome]:
    """The four folds, their spread and the in-sample figures; returns the pooled held-out
    outcomes (each question under the setting its fold chose). ``names``: conversation names."""
    found = folds(by_setting, choose)
    everyone = {o.conversation for outcomes in by_setting.values() for o in outcomes}
    print(f"\n== leave one conversation out: {title} ({len(by_setting)} settings)")
    head = f"{'held out':10} {'chosen on the others':28} {'train':>7} {'held out':>9}"
    head += "".join(f"{CATEGORIES[c][:11]:>12}" for c in CATEGORIES) + f"{'tokens':>8}"
    print(head)
    print("-" * len(head))
    pooled: list[Outcome] = []
    for f in found:
        name = names[f.held_out] if f.held_out < len(names) else f"conv {f.held_out}"
        cells = "".join(f"{_pct(f.test, c):>12}" for c in CATEGORIES)
        sent = 100 * statistics.mean(o.sent for o in f.test) if f.test else 0.0
        print(f"{name:10} {f.chosen:28} {100 * f.train:6.1f}% {_pct(f.test):>9}{cells}{sent:7.1f}%")
        pooled += f.test
    cells = "".join(f"{_pct(pooled, c):>12}" for c in CATEGORIES)
    print(f"{'pooled':10} {'(each by its fold)':28} {'':7} {_pct(pooled):>9}{cells}")
    tests = [100 * rate(f.test) for f in found]
    spread = statistics.stdev(tests) if len(tests) > 1 else 0.0
    print(
        f"held-out folds: {min(tests):.1f}% to {max(tests):.1f}% "
        f"(mean {statistics.mean(tests):.1f}, sd {spread:.1f})"
    )
    chosen = choose(by_setting, everyone)
    rows = [("in sample, chosen on all", chosen)]
    rows += [("in sample, a default", label) for label in defaults if label in by_setting]
    for what, label in rows:
        outcomes = by_setting[label]
        cells = "".join(f"{_pct(outcomes, c):>12}" for c in CATEGORIES)
        print(f"{what:28} {label:28} {_pct(outcomes):>9}{cells}")
    return pooled
