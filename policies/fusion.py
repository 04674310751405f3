"""Fusing lexical and semantic hits into one ranking for recall.

Each list is scaled by its own best score (BM25 has no fixed range, cosine
similarity is in [-1, 1]; a negative one counts as 0), then

    score = weight * cos / max cos + (1 - weight) * bm25 / max bm25

over the union of the two lists, a hit missing from one list scoring 0
there. ``weight`` 0 is lexical order (semantic hits follow, in their
order), 1 is semantic order. Scaling by the best rather than by the range
(min-max) keeps a list whose scores are all close from being stretched into
a spread it does not have (measured in bench/recall.py: max scaling ranks
the evidence higher than min-max at every weight).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.recall import Hit

# Below any real score: keeps the hits of a weight-0 list ordered among themselves.
_TIE = 1e-6


def _scaled(hits: Sequence[Hit]) -> dict[int, tuple[float, int | None]]:
    best = max((h.score for h in hits), default=0.0)
    out: dict[int, tuple[float, int | None]] = {}
    for h in hits:
        value = max(0.0, h.score) / best if best > 0 else 0.0
        if h.index not in out or value > out[h.index][0]:
            out[h.index] = (value, h.item_id)
    return out


def fuse(lexical: Sequence[Hit], semantic: Sequence[Hit], weight: float) -> list[Hit]:
    """One hit per position, best first: the weighted sum of each list's scaled score."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1], got {weight}")
    lex, sem = _scaled(lexical), _scaled(semantic)
    out: list[Hit] = []
    for index in lex.keys() | sem.keys():
        lv, lid = lex.get(index, (0.0, None))
        sv, sid = sem.get(index, (0.0, None))
        # The list with no weight still orders ties (and what would score 0).
        score = weight * sv + (1 - weight) * lv + _TIE * (lv + sv)
        out.append(Hit(index, score, lid if lid is not None else sid))
    out.sort(key=lambda h: (-h.score, -h.index))
    return out
